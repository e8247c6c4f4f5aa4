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

    /// The entry for `h` (owning pod and its generation then), if any.
    pub fn owner(&self, h: BlockHash) -> Option<Entry> {
        self.layout
            .slots(h)
            .into_iter()
            .filter_map(|s| self.read(s).0)
            .find(|e| e.hash == h)
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
            let i = pick_slot(h, [cur[0].0.as_ref(), cur[1].0.as_ref()]);
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
        // re-recording the same owner writes nothing; a new owner or generation takes over
        assert_eq!(t.record(&hs, "127.0.0.1:1", 0).written, 0);
        assert_eq!(t.record(&hs[..1], "127.0.0.1:2", 0).written, 1);
        assert_eq!(owner(hs[0]), Some(("127.0.0.1:2".into(), 0)));
        assert_eq!(t.record(&hs[1..2], "127.0.0.1:1", 7).written, 1);
        assert_eq!(owner(hs[1]), Some(("127.0.0.1:1".into(), 7)));
        // removal only forgets the named pod's entries
        assert_eq!(t.remove(&hs[..2], "127.0.0.1:1"), 1);
        assert_eq!(owner(hs[1]), None);
        assert_eq!(owner(hs[0]), Some(("127.0.0.1:2".into(), 0)));
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
        t.record(&[BlockHash(7)], "127.0.0.1:1", 0); // creates the key (no CAS on new keys)
        let s = t.record(&[BlockHash(7)], "127.0.0.1:2", 0);
        assert_eq!(s.conflicts, 1);
    }
}
