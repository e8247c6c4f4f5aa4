//! How many requests of a prefix are in flight: the `demand` the cost policy weighs a
//! replica's queueing saving with (`prefix_core::policy` `cost`).
//!
//! Each worker VM counts its own requests per first block (the prefix's name), bounded; the
//! fleet-wide figure is that count scaled by the fleet's in-flight total (shared data, already
//! read for every request) over this VM's. So no shared-data call is added per request, and
//! with requests spread evenly over workers the estimate is the fleet's count.

use prefix_core::BlockHash;
use std::cell::{Cell, RefCell};
use std::collections::HashMap;

/// Prefixes counted at most per VM; a request of a prefix beyond them counts as demand 1.
pub const MAX_PREFIXES: usize = 4096;

#[derive(Default)]
pub struct Demand {
    counts: RefCell<HashMap<BlockHash, u32>>,
    /// The sum of `counts` (kept, not summed per request).
    total: Cell<u32>,
}

impl Demand {
    /// This VM's requests of `key` in flight.
    fn local(&self, key: BlockHash) -> u32 {
        self.counts.borrow().get(&key).copied().unwrap_or(0)
    }

    /// The fleet's requests of `key` in flight, this one included, given the fleet's in-flight
    /// total.
    pub fn estimate(&self, key: BlockHash, fleet_total: u32) -> u32 {
        let local = self.local(key);
        let local_total = self.total.get();
        if local == 0 || local_total == 0 {
            return 1;
        }
        let scale = f64::from(fleet_total.max(local_total)) / f64::from(local_total);
        (f64::from(local) * scale).round() as u32 + 1
    }

    /// A request of `key` was sent; `false` when the table is full and it was not counted.
    pub fn enter(&self, key: BlockHash) -> bool {
        let mut c = self.counts.borrow_mut();
        if c.len() >= MAX_PREFIXES && !c.contains_key(&key) {
            return false;
        }
        *c.entry(key).or_insert(0) += 1;
        self.total.set(self.total.get().saturating_add(1));
        true
    }

    /// A request counted by [`Demand::enter`] ended.
    pub fn leave(&self, key: BlockHash) {
        let mut c = self.counts.borrow_mut();
        if let Some(n) = c.get_mut(&key) {
            *n = n.saturating_sub(1);
            self.total.set(self.total.get().saturating_sub(1));
            if *n == 0 {
                c.remove(&key);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_scale_to_the_fleet_and_empty_out() {
        let d = Demand::default();
        let (a, b) = (BlockHash(1), BlockHash(2));
        assert_eq!(
            d.estimate(a, 10),
            1,
            "nothing in flight here: just this one"
        );
        for _ in 0..3 {
            assert!(d.enter(a));
        }
        assert!(d.enter(b));
        assert_eq!(d.estimate(a, 4), 4, "three here, all of the fleet's");
        assert_eq!(d.estimate(a, 8), 7, "another worker holds as many again");
        assert_eq!(
            d.estimate(b, 0),
            2,
            "a stale fleet total never shrinks the local count"
        );
        for _ in 0..3 {
            d.leave(a);
        }
        d.leave(a);
        assert_eq!(d.estimate(a, 8), 1);
        d.leave(b);
        assert!(d.counts.borrow().is_empty());
        assert_eq!(
            d.total.get(),
            0,
            "a key never entered leaves nothing behind"
        );
    }

    #[test]
    fn bounded() {
        let d = Demand::default();
        for i in 0..MAX_PREFIXES as u64 {
            assert!(d.enter(BlockHash(i)));
        }
        assert!(
            !d.enter(BlockHash(u64::MAX)),
            "a new prefix beyond the bound"
        );
        assert!(d.enter(BlockHash(0)), "a counted one still counts");
        assert_eq!(d.counts.borrow().len(), MAX_PREFIXES);
    }
}
