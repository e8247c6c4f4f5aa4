//! The ownership table in Envoy shared data: which pod computed which block.
//!
//! Layout and replacement rules live in `prefix_core::table`; this is the thin part that
//! reads and writes the slots through [`Host`], with compare-and-swap so Envoy's worker
//! threads never lose each other's updates silently.

use crate::host::{Host, SetOutcome};
use prefix_core::table::{pick_slot, Entry, TableLayout};
use prefix_core::BlockHash;

/// What recording a prompt's blocks did to the table.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct RecordStats {
    pub written: u32,
    /// Slots that held another block and were overwritten (capacity pressure).
    pub replaced: u32,
    /// Slots that were empty before.
    pub filled: u32,
    /// Writes lost to a concurrent writer (CAS mismatch) or a host failure.
    pub conflicts: u32,
}

pub struct OwnershipTable<'a, H: Host> {
    host: &'a H,
    layout: &'a TableLayout,
}

impl<'a, H: Host> OwnershipTable<'a, H> {
    pub fn new(host: &'a H, layout: &'a TableLayout) -> Self {
        OwnershipTable { host, layout }
    }

    fn read(&self, slot: u64) -> (Option<Entry>, Option<u32>) {
        match self.host.shared_get(&self.layout.key(slot)) {
            Some((v, cas)) => (Entry::decode(&v), cas),
            None => (None, None),
        }
    }

    /// The entries for `h` (owning pods and their generations then): at most two.
    pub fn owners(&self, h: BlockHash) -> [Option<Entry>; 2] {
        let [a, b] = self.layout.slots(h);
        let mine = |slot: u64| self.read(slot).0.filter(|e| e.hash == h);
        let first = mine(a);
        // with capacity 1 both candidates are the same slot
        let second = if b == a { None } else { mine(b) };
        [first, second]
    }

    /// The most recently recorded entry for `h`, if any.
    pub fn owner(&self, h: BlockHash) -> Option<Entry> {
        let [a, b] = self.owners(h);
        match (a, b) {
            (Some(a), Some(b)) => Some(if b.stamp > a.stamp { b } else { a }),
            (a, b) => a.or(b),
        }
    }

    /// Forgets blocks `pod` no longer holds (entries now owned by another pod are kept).
    pub fn remove(&self, hashes: &[BlockHash], pod: &str) -> u32 {
        let mut removed = 0;
        for &h in hashes {
            for slot in self.layout.slots(h) {
                let (cur, cas) = self.read(slot);
                if cur.is_some_and(|e| e.hash == h && e.pod == pod)
                    && self.host.shared_set(&self.layout.key(slot), &[], cas) == SetOutcome::Written
                {
                    removed += 1;
                }
            }
        }
        removed
    }

    /// Records `pod` (at cache `generation`) as the owner of every block in `hashes`.
    pub fn record(&self, hashes: &[BlockHash], pod: &str, generation: u64) -> RecordStats {
        let mut stats = RecordStats::default();
        // one clock read per prompt: its blocks age together
        let stamp = self.host.now_nanos();
        for &h in hashes {
            let slots = self.layout.slots(h);
            let cur = [self.read(slots[0]), self.read(slots[1])];
            let i = pick_slot(h, pod, [cur[0].0.as_ref(), cur[1].0.as_ref()]);
            let (old, cas) = &cur[i];
            if old
                .as_ref()
                .is_some_and(|e| e.hash == h && e.pod == pod && e.generation == generation)
            {
                continue; // already recorded
            }
            let entry = Entry {
                hash: h,
                stamp,
                generation,
                pod: pod.to_owned(),
            };
            match self
                .host
                .shared_set(&self.layout.key(slots[i]), &entry.encode(), *cas)
            {
                SetOutcome::Written => {
                    stats.written += 1;
                    match old {
                        Some(e) if e.hash != h => stats.replaced += 1,
                        None => stats.filled += 1,
                        _ => {}
                    }
                }
                SetOutcome::CasMismatch | SetOutcome::Failed => stats.conflicts += 1,
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
        let s = t.record(&hs, "127.0.0.1:1", 0);
        assert_eq!((s.written, s.filled), (5, 5));
        assert!(hs
            .iter()
            .all(|&h| owner(h) == Some(("127.0.0.1:1".into(), 0))));
        // re-recording the same owner writes nothing; a new generation replaces its entry;
        // another pod becomes a second owner, and a third replaces the older of the two
        assert_eq!(t.record(&hs, "127.0.0.1:1", 0).written, 0);
        assert_eq!(t.record(&hs[1..2], "127.0.0.1:1", 7).written, 1);
        assert_eq!(owner(hs[1]), Some(("127.0.0.1:1".into(), 7)));
        assert_eq!(t.record(&hs[..1], "127.0.0.1:2", 0).written, 1);
        assert_eq!(owner(hs[0]), Some(("127.0.0.1:2".into(), 0)), "newest");
        let pods = |h| {
            let mut v: Vec<String> = t.owners(h).into_iter().flatten().map(|e| e.pod).collect();
            v.sort();
            v
        };
        assert_eq!(pods(hs[0]), ["127.0.0.1:1", "127.0.0.1:2"]);
        assert_eq!(t.record(&hs[..1], "127.0.0.1:3", 0).written, 1);
        assert_eq!(pods(hs[0]), ["127.0.0.1:2", "127.0.0.1:3"]);
        // removal only forgets the named pod's entries
        assert_eq!(t.remove(&hs[..2], "127.0.0.1:1"), 1);
        assert_eq!(owner(hs[1]), None);
        assert_eq!(t.remove(&hs[..1], "127.0.0.1:3"), 1);
        assert_eq!(pods(hs[0]), ["127.0.0.1:2"]);
    }

    #[test]
    fn bounded_and_oldest_replaced() {
        let host = FakeHost::default();
        let layout = TableLayout::new("t", 16);
        let t = OwnershipTable::new(&host, &layout);
        let key = |i: u64| BlockHash(i.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        let mut replaced = 0;
        for i in 0..1000u64 {
            replaced += t.record(&[key(i)], "127.0.0.1:1", 0).replaced;
        }
        assert!(host.data.borrow().len() <= 16, "never more keys than slots");
        assert!(replaced > 900);
        // the newest block is always findable
        assert_eq!(
            t.owner(key(999)).map(|e| e.pod).as_deref(),
            Some("127.0.0.1:1")
        );
    }

    #[test]
    fn cas_conflict_is_counted_not_lost_silently() {
        struct Racy(FakeHost);
        impl Host for Racy {
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
        t.record(&[BlockHash(7)], "127.0.0.1:1", 0);
        // a new generation rewrites that existing key, racing the other worker
        let s = t.record(&[BlockHash(7)], "127.0.0.1:1", 1);
        assert_eq!(s.conflicts, 1);
    }
}
