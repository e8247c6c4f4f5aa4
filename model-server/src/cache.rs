//! The block prefix cache: which full token blocks this pod has already computed.
//!
//! Keys are chained [`BlockHash`]es, so "the longest chain of leading blocks present" is just
//! the number of leading hashes found. Capacity is fixed in blocks. Blocks pinned by a running
//! request (its hits and the blocks it stored) are never evicted; unpinned blocks sit in an LRU
//! list and the least recently used goes first when room is needed. Every operation is
//! O(blocks in the prompt) under one short mutex hold.
//!
//! Like vLLM, a request whose whole prompt is cached still recomputes its last block, because
//! the engine needs at least one prompt token to produce the first output logits.

use lru::LruCache;
use prefix_core::protocol::{CacheEvent, EventLog, EventsPage};
use prefix_core::BlockHash;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

/// What changed in the cache, for its metrics and its cache events (`/v1/cache/events`).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct StoreOutcome {
    pub stored: usize,
    pub evicted: usize,
}

#[derive(Debug)]
struct Inner<P> {
    /// block → number of running requests pinning it
    pins: HashMap<BlockHash, u32>,
    /// unpinned blocks, least recently used at the back
    free: LruCache<BlockHash, ()>,
    /// what changed, in order (under the same lock, so events match the maps exactly)
    events: EventLog,
    /// engine data of held blocks (absent for engines that keep none)
    payloads: HashMap<BlockHash, P>,
}

/// The server's prefix cache: each block with its K/V, for engines that keep it.
pub type Cache = BlockPrefixCache<gguf_engine::KvBlock>;

/// A fixed-capacity, LRU, pin-aware block prefix cache of `block_size`-token blocks, each
/// optionally with an engine payload `P` (the real engine: that block's K/V). Cheap to share
/// (`Arc`).
#[derive(Debug)]
pub struct BlockPrefixCache<P = ()> {
    capacity: usize,
    block_size: usize,
    /// A block without its payload is no hit (engines that cannot recompute attention state
    /// from a hash alone).
    payload_required: bool,
    inner: Mutex<Inner<P>>,
}

/// A running request's hold on the cache: its hit blocks, then the blocks it stored, stay
/// pinned until the lease is dropped.
#[derive(Debug)]
pub struct Lease<P: Clone = ()> {
    cache: Arc<BlockPrefixCache<P>>,
    pinned: Vec<BlockHash>,
    hit_blocks: usize,
    /// payloads of the hit blocks, in order (when the cache requires them)
    hit_payloads: Vec<P>,
}

impl<P: Clone> BlockPrefixCache<P> {
    /// A cache holding at most `capacity` blocks (0 disables caching) of `block_size` tokens,
    /// with epoch 0; hash-only blocks are hits.
    pub fn new(capacity: usize, block_size: usize) -> Arc<Self> {
        Self::with(capacity, block_size, 0, false)
    }

    /// A cache whose event log carries `epoch` (new at every process start); with
    /// `payload_required`, only blocks stored with a payload are hits.
    pub fn with(
        capacity: usize,
        block_size: usize,
        epoch: u64,
        payload_required: bool,
    ) -> Arc<Self> {
        Arc::new(BlockPrefixCache {
            capacity,
            block_size: block_size.max(1),
            payload_required,
            inner: Mutex::new(Inner {
                pins: HashMap::new(),
                free: LruCache::unbounded(),
                events: EventLog::new(epoch, 4096),
                payloads: HashMap::new(),
            }),
        })
    }

    /// Cache events after `since` (see [`crate::events`]).
    pub fn events_since(&self, since: u64) -> EventsPage {
        let g = self.lock();
        g.events.since(since, || {
            g.pins
                .keys()
                .copied()
                .chain(g.free.iter().map(|(h, _)| *h))
                .collect()
        })
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Blocks currently held (pinned or not).
    pub fn len(&self) -> usize {
        let g = self.lock();
        g.pins.len() + g.free.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Fraction of capacity in use, as vLLM's `kv_cache_usage_perc` (0.0–1.0).
    pub fn usage(&self) -> f64 {
        if self.capacity == 0 {
            0.0
        } else {
            self.len() as f64 / self.capacity as f64
        }
    }

    /// Whether `hash` is held.
    pub fn contains(&self, hash: &BlockHash) -> bool {
        let g = self.lock();
        g.pins.contains_key(hash) || g.free.contains(hash)
    }

    /// Tokens per block.
    pub fn block_size(&self) -> usize {
        self.block_size
    }

    fn lock(&self) -> MutexGuard<'_, Inner<P>> {
        // A poisoned lock only means another request panicked mid-update of plain counters;
        // the maps are still structurally valid, so keep serving.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Looks up the longest chain of leading blocks of a prompt of `prompt_tokens` tokens and
    /// pins those blocks. At least one prompt token is always left to compute.
    pub fn acquire(self: &Arc<Self>, hashes: &[BlockHash], prompt_tokens: usize) -> Lease<P> {
        let mut g = self.lock();
        let mut hits = hashes
            .iter()
            .take_while(|h| {
                (g.pins.contains_key(h) || g.free.contains(h))
                    && (!self.payload_required || g.payloads.contains_key(h))
            })
            .count();
        if hits > 0 && hits * self.block_size >= prompt_tokens {
            hits -= 1;
        }
        let pinned: Vec<BlockHash> = hashes[..hits].to_vec();
        for h in &pinned {
            pin(&mut g, *h);
        }
        let hit_payloads = if self.payload_required {
            pinned
                .iter()
                .filter_map(|h| g.payloads.get(h).cloned())
                .collect()
        } else {
            Vec::new()
        };
        drop(g);
        Lease {
            cache: Arc::clone(self),
            pinned,
            hit_blocks: hits,
            hit_payloads,
        }
    }
}

fn pin<P>(g: &mut Inner<P>, h: BlockHash) {
    if g.free.pop(&h).is_some() {
        g.pins.insert(h, 1);
    } else if let Some(n) = g.pins.get_mut(&h) {
        *n += 1;
    }
}

impl<P: Clone> Lease<P> {
    /// Leading blocks found in the cache.
    pub fn hit_blocks(&self) -> usize {
        self.hit_blocks
    }

    /// The hit blocks' payloads, in order (when the cache requires payloads).
    pub fn hit_payloads(&self) -> &[P] {
        &self.hit_payloads
    }

    /// After prefill: stores the prompt's full blocks (the same `hashes` given to
    /// [`BlockPrefixCache::acquire`]) beyond the hits, evicting unpinned LRU blocks for room.
    /// When everything left is pinned, the rest is not stored.
    pub fn store(&mut self, hashes: &[BlockHash]) -> StoreOutcome {
        self.store_with(hashes, Vec::new())
    }

    /// [`Lease::store`] with each new block's payload: `payloads[i]` belongs to
    /// `hashes[hit_blocks + i]` (missing entries store the hash alone).
    pub fn store_with(&mut self, hashes: &[BlockHash], payloads: Vec<P>) -> StoreOutcome {
        let mut payloads = payloads.into_iter();
        let cache = Arc::clone(&self.cache);
        let mut g = cache.lock();
        let mut out = StoreOutcome::default();
        if cache.capacity == 0 {
            return out;
        }
        let mut stored = Vec::new();
        let mut evicted = Vec::new();
        for &h in hashes.iter().skip(self.hit_blocks) {
            let payload = payloads.next();
            if g.pins.contains_key(&h) || g.free.contains(&h) {
                // computed concurrently by another request: share it (and its payload, or
                // give it ours if it has none)
                pin(&mut g, h);
                self.pinned.push(h);
                if let Some(p) = payload {
                    g.payloads.entry(h).or_insert(p);
                }
                continue;
            }
            if g.pins.len() + g.free.len() >= cache.capacity {
                let Some((old, ())) = g.free.pop_lru() else {
                    break;
                };
                g.payloads.remove(&old);
                evicted.push(old);
                out.evicted += 1;
            }
            g.pins.insert(h, 1);
            if let Some(p) = payload {
                g.payloads.insert(h, p);
            }
            self.pinned.push(h);
            stored.push(h);
            out.stored += 1;
        }
        g.events.push(CacheEvent::BlockRemoved { hashes: evicted });
        g.events.push(CacheEvent::BlockStored { hashes: stored });
        out
    }
}

impl<P: Clone> Drop for Lease<P> {
    fn drop(&mut self) {
        let mut g = self.cache.lock();
        for h in self.pinned.drain(..) {
            match g.pins.get_mut(&h) {
                Some(n) if *n > 1 => *n -= 1,
                Some(_) => {
                    g.pins.remove(&h);
                    g.free.put(h, ());
                }
                None => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hs(r: std::ops::Range<u64>) -> Vec<BlockHash> {
        r.map(BlockHash).collect()
    }

    #[test]
    fn longest_leading_chain() {
        let c = BlockPrefixCache::<()>::new(10, 128);
        let mut l = c.acquire(&hs(0..3), 400);
        assert_eq!(l.hit_blocks(), 0);
        assert_eq!(l.store(&hs(0..3)).stored, 3);
        drop(l);
        assert_eq!(c.acquire(&hs(0..3), 400).hit_blocks(), 3);
        // only the first block shared
        let mixed = vec![BlockHash(0), BlockHash(77), BlockHash(2)];
        assert_eq!(c.acquire(&mixed, 400).hit_blocks(), 1);
        // a gap at the start means no hit at all
        let gap = vec![BlockHash(99), BlockHash(1)];
        assert_eq!(c.acquire(&gap, 400).hit_blocks(), 0);
    }

    #[test]
    fn whole_prompt_cached_recomputes_last_block() {
        let c = BlockPrefixCache::<()>::new(10, 128);
        c.acquire(&hs(0..2), 256).store(&hs(0..2));
        assert_eq!(c.acquire(&hs(0..2), 256).hit_blocks(), 1);
        assert_eq!(c.acquire(&hs(0..2), 257).hit_blocks(), 2);
    }

    #[test]
    fn lru_eviction_at_capacity() {
        let c = BlockPrefixCache::<()>::new(3, 128);
        c.acquire(&hs(0..2), 1000).store(&hs(0..2));
        c.acquire(&hs(10..11), 1000).store(&hs(10..11));
        // touch block 0..2 so block 10 becomes least recently used
        drop(c.acquire(&hs(0..2), 1000));
        let out = c.acquire(&hs(20..21), 1000).store(&hs(20..21));
        assert_eq!(
            out,
            StoreOutcome {
                stored: 1,
                evicted: 1
            }
        );
        assert!(!c.contains(&BlockHash(10)));
        assert!(c.contains(&BlockHash(0)) && c.contains(&BlockHash(1)));
        assert_eq!(c.len(), 3);
    }

    #[test]
    fn pinned_blocks_are_never_evicted() {
        let c = BlockPrefixCache::<()>::new(2, 128);
        let mut running = c.acquire(&hs(0..2), 1000);
        running.store(&hs(0..2));
        // everything is pinned: a new request cannot store
        let out = c.acquire(&hs(5..6), 1000).store(&hs(5..6));
        assert_eq!(
            out,
            StoreOutcome {
                stored: 0,
                evicted: 0
            }
        );
        assert!(c.contains(&BlockHash(0)) && c.contains(&BlockHash(1)));
        drop(running);
        let out = c.acquire(&hs(5..6), 1000).store(&hs(5..6));
        assert_eq!(
            out,
            StoreOutcome {
                stored: 1,
                evicted: 1
            }
        );
        assert_eq!(c.len(), 2);
        assert!((c.usage() - 1.0).abs() < 1e-9);
    }

    #[test]
    fn events_follow_stores_and_evictions() {
        let c = BlockPrefixCache::<()>::with(2, 128, 9, false);
        c.acquire(&hs(0..2), 1000).store(&hs(0..2));
        c.acquire(&hs(5..6), 1000).store(&hs(5..6));
        let p = c.events_since(0);
        let kinds: Vec<CacheEvent> = p.events.into_iter().map(|e| e.event).collect();
        assert_eq!(
            kinds,
            vec![
                CacheEvent::BlockStored { hashes: hs(0..2) },
                CacheEvent::BlockRemoved {
                    hashes: vec![BlockHash(0)]
                },
                CacheEvent::BlockStored { hashes: hs(5..6) },
            ]
        );
        let mut snap = c.events_since(u64::MAX - 1).snapshot.unwrap();
        snap.sort();
        assert_eq!(snap, vec![BlockHash(1), BlockHash(5)]);
    }

    #[test]
    fn payloads_follow_their_blocks() {
        let c = BlockPrefixCache::<u32>::with(2, 128, 0, true);
        let p = |n: u32| n;
        let mut l = c.acquire(&hs(0..2), 1000);
        assert_eq!(l.hit_blocks(), 0);
        l.store_with(&hs(0..2), vec![p(10), p(11)]);
        drop(l);
        let l = c.acquire(&hs(0..2), 1000);
        assert_eq!(l.hit_blocks(), 2);
        assert_eq!(l.hit_payloads(), [10, 11]);
        drop(l);
        // a hash stored without a payload ends the chain for payload users
        c.acquire(&hs(7..8), 1000).store(&hs(7..8)); // evicts block 0
        assert_eq!(c.acquire(&hs(0..2), 1000).hit_blocks(), 0);
        assert_eq!(
            c.acquire(&hs(7..8), 1000).hit_blocks(),
            0,
            "no payload, no hit"
        );
        assert!(c.contains(&BlockHash(7)), "held all the same");
        let g = c.lock();
        assert!(
            !g.payloads.contains_key(&BlockHash(0)),
            "evicted blocks drop their payload"
        );
    }

    #[test]
    fn zero_capacity_caches_nothing() {
        let c = BlockPrefixCache::<()>::new(0, 128);
        assert_eq!(c.acquire(&hs(0..2), 300).store(&hs(0..2)).stored, 0);
        assert_eq!(c.acquire(&hs(0..2), 300).hit_blocks(), 0);
    }

    #[test]
    fn concurrent_use_is_consistent() {
        let c = BlockPrefixCache::<()>::new(50, 128);
        std::thread::scope(|s| {
            for t in 0..4u64 {
                let c = &c;
                s.spawn(move || {
                    for i in 0..500u64 {
                        let h = hs((t * 7 + i) % 80..(t * 7 + i) % 80 + 3);
                        let mut l = c.acquire(&h, 1000);
                        l.store(&h);
                    }
                });
            }
        });
        assert!(c.len() <= 50);
        let g = c.lock();
        assert!(g.pins.is_empty(), "all leases dropped, nothing pinned");
    }
}
