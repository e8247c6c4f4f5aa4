//! Pod blocks → router blocks: vLLM's events name blocks by vLLM's own hashes, the router by
//! this project's chained hashes (`prefix_core::block`). The tokens are in every
//! `BlockStored`, so each router hash is recomputed from them, chaining through
//! `parent_block_hash` exactly as the filter chains a prompt's blocks.
//!
//! - **Roots.** A chain's first block (no parent) starts at `root_hash(model, salt)`: the
//!   model is the name the router hashes with (a LoRA adapter's blocks are seeded with
//!   `model_seed(model, adapter)`, as the filter does), the salt is the `cache_salt` vLLM puts
//!   in the first block's `extra_keys`.
//! - **Block sizes.** The router's block may be a whole multiple of the pod's (vLLM's GPU
//!   default is 16 tokens, the router's 128): a router block is held when the pod block that
//!   completes it is stored, and stops being held when that block is removed (vLLM evicts a
//!   chain's tail first). Any other pair of sizes is refused ([`TranslateError`]): the router
//!   could never match what such a pod holds.
//! - **What is not followed**: blocks of other media (`CPU`/`STORAGE` offload tiers), of KV
//!   groups other than the first, with multimodal or embedding keys, named by a numeric
//!   `lora_id` only, or whose parent is unknown (stored before this process listened). They
//!   are left out, and so are their descendants: the router may miss a hit, never claim one.
//! - **Bounds.** At most `max_blocks` pod blocks are followed; past that (only a pod whose
//!   removals were lost gets there) everything is forgotten at once, an `AllCleared`, rather
//!   than a stale owner kept.

use crate::wire::{BlockStored, ExtraKey, PodBlockId, PodEvent};
use prefix_core::block::{chain_hash, model_seed, root_hash};
use prefix_core::protocol::CacheEvent;
use prefix_core::{BlockHash, BlockSize};
use std::collections::HashMap;
use thiserror::Error;

#[derive(Debug, Error, PartialEq, Eq)]
pub enum TranslateError {
    #[error(
        "the pod's blocks are {pod} tokens and the router's {router}: the router's block size must \
         be a whole multiple of the pod's (set the router's block_size, or the pod's --block-size)"
    )]
    BlockSizes { pod: u32, router: u32 },
}

/// What one pod block is, as far as the router's chain goes.
#[derive(Debug, Clone)]
struct Tracked {
    parent: Option<PodBlockId>,
    /// The router hash the router block this pod block belongs to continues (a root, or the
    /// hash of the router block before it).
    base: BlockHash,
    /// This pod block's place in its router block, 1-based (`ratio` when it completes it).
    depth: u32,
    /// Its tokens, kept only while a later pod block may need them to complete a router block.
    tokens: Box<[u32]>,
    /// The router block it completes.
    completes: Option<BlockHash>,
}

/// Counts of what was not followed, for the sidecar's log and metrics.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Skipped {
    pub other_medium: u64,
    pub unknown_parent: u64,
    pub opaque_keys: u64,
    pub unknown_events: u64,
    pub over_limit_resets: u64,
}

/// One pod's blocks, translated.
pub struct Translator {
    model: String,
    router_block: BlockSize,
    max_blocks: usize,
    blocks: HashMap<PodBlockId, Tracked>,
    /// router block → pod blocks completing it (normally one)
    held: HashMap<BlockHash, u32>,
    pub skipped: Skipped,
}

impl Translator {
    pub fn new(model: &str, router_block: BlockSize, max_blocks: usize) -> Self {
        Translator {
            model: model.to_owned(),
            router_block,
            max_blocks: max_blocks.max(1),
            blocks: HashMap::new(),
            held: HashMap::new(),
            skipped: Skipped::default(),
        }
    }

    /// Router blocks held now (a resync's snapshot).
    pub fn held(&self) -> Vec<BlockHash> {
        let mut held: Vec<BlockHash> = self.held.keys().copied().collect();
        held.sort_unstable();
        held
    }

    /// Pod blocks followed now.
    pub fn pod_blocks(&self) -> usize {
        self.blocks.len()
    }

    /// Forgets everything: the pod restarted, or events were lost for good.
    pub fn clear(&mut self) -> CacheEvent {
        self.blocks.clear();
        self.held.clear();
        CacheEvent::AllCleared
    }

    /// The router's events for one of the pod's.
    pub fn apply(&mut self, event: &PodEvent) -> Result<Vec<CacheEvent>, TranslateError> {
        Ok(match event {
            PodEvent::BlockStored(s) => {
                let mut out = Vec::new();
                let stored = self.stored(s)?;
                if self.blocks.len() > self.max_blocks {
                    self.skipped.over_limit_resets += 1;
                    out.push(self.clear());
                } else if !stored.is_empty() {
                    out.push(CacheEvent::BlockStored { hashes: stored });
                }
                out
            }
            PodEvent::BlockRemoved {
                block_hashes,
                medium,
                group_idx,
            } => {
                if !primary(medium.as_deref(), *group_idx) {
                    return Ok(Vec::new());
                }
                let removed = self.removed(block_hashes);
                if removed.is_empty() {
                    Vec::new()
                } else {
                    vec![CacheEvent::BlockRemoved { hashes: removed }]
                }
            }
            PodEvent::AllBlocksCleared => vec![self.clear()],
            PodEvent::Unknown(_) => {
                self.skipped.unknown_events += 1;
                Vec::new()
            }
        })
    }

    fn stored(&mut self, s: &BlockStored) -> Result<Vec<BlockHash>, TranslateError> {
        if !primary(s.medium.as_deref(), s.group_idx) {
            self.skipped.other_medium += 1;
            return Ok(Vec::new());
        }
        let pod = s.block_size;
        let router = self.router_block.get();
        if pod == 0 || router % pod != 0 {
            return Err(TranslateError::BlockSizes { pod, router });
        }
        let ratio = router / pod;
        // where the chain stands before the first of these blocks
        let (mut base, mut depth) = match s.parent {
            None => {
                let Some(seed) = self.seed(s) else {
                    self.skipped.opaque_keys += 1;
                    return Ok(Vec::new());
                };
                let salt = first_salt(s);
                (root_hash(&seed, salt.as_deref()), 0)
            }
            Some(p) => match self.blocks.get(&p) {
                Some(t) => match t.completes {
                    Some(h) if t.depth == ratio => (h, 0),
                    _ => (t.base, t.depth),
                },
                None => {
                    self.skipped.unknown_parent += 1;
                    return Ok(Vec::new());
                }
            },
        };
        let opaque = |i: usize| {
            s.extra_keys
                .as_ref()
                .and_then(|k| k.get(i))
                .and_then(Option::as_ref)
                .is_some_and(|keys| keys.contains(&ExtraKey::Other))
        };
        let mut stored = Vec::new();
        let mut parent = s.parent;
        for (i, (&id, tokens)) in s
            .block_hashes
            .iter()
            .zip(s.token_ids.chunks_exact(pod as usize))
            .enumerate()
        {
            if opaque(i) {
                self.skipped.opaque_keys += 1;
                break; // neither this block nor what continues it can be named by tokens
            }
            depth += 1;
            let completes = if depth == ratio {
                let Some(all) = self.router_tokens(parent, ratio - 1, tokens) else {
                    self.skipped.unknown_parent += 1;
                    break;
                };
                Some(chain_hash(base, &all))
            } else {
                None
            };
            let keep = if completes.is_some() { &[][..] } else { tokens };
            if let Some(old) = self.blocks.insert(
                id,
                Tracked {
                    parent,
                    base,
                    depth,
                    tokens: keep.into(),
                    completes,
                },
            ) {
                self.release(old.completes); // stored again: counted once
            }
            if let Some(h) = completes {
                *self.held.entry(h).or_insert(0) += 1;
                stored.push(h);
                base = h;
                depth = 0;
            }
            parent = Some(id);
        }
        Ok(stored)
    }

    /// The tokens of a router block ending with `last`: the `before` pod blocks up the chain
    /// from `parent`, then `last`.
    fn router_tokens(
        &self,
        parent: Option<PodBlockId>,
        before: u32,
        last: &[u32],
    ) -> Option<Vec<u32>> {
        if before == 0 {
            return Some(last.to_vec());
        }
        let mut pieces = Vec::with_capacity(before as usize);
        let mut at = parent;
        for _ in 0..before {
            let t = self.blocks.get(&at?)?;
            pieces.push(&t.tokens);
            at = t.parent;
        }
        let mut all: Vec<u32> = pieces
            .iter()
            .rev()
            .flat_map(|t| t.iter().copied())
            .collect();
        all.extend_from_slice(last);
        Some(all)
    }

    fn removed(&mut self, ids: &[PodBlockId]) -> Vec<BlockHash> {
        let mut out = Vec::new();
        for id in ids {
            if let Some(t) = self.blocks.remove(id) {
                if let Some(h) = self.release(t.completes) {
                    out.push(h);
                }
            }
        }
        out
    }

    /// One fewer pod block completes `h`; `Some(h)` when none is left.
    fn release(&mut self, h: Option<BlockHash>) -> Option<BlockHash> {
        let h = h?;
        let n = self.held.get_mut(&h)?;
        *n = n.saturating_sub(1);
        if *n == 0 {
            self.held.remove(&h);
            return Some(h);
        }
        None
    }

    /// The name this chain's root is seeded with; `None` for an adapter known only by number.
    fn seed(&self, s: &BlockStored) -> Option<String> {
        match (&s.lora_name, s.lora_id) {
            (Some(name), _) => Some(model_seed(&self.model, Some(name))),
            (None, Some(_)) => None,
            (None, None) => Some(model_seed(&self.model, None)),
        }
    }
}

/// The pod's own cache: not an offload tier, the first KV group.
fn primary(medium: Option<&str>, group: Option<i64>) -> bool {
    medium.is_none_or(|m| m.eq_ignore_ascii_case("GPU")) && group.unwrap_or(0) == 0
}

/// The `cache_salt` of a chain's first block: SGLang's metadata, or vLLM's first text key
/// that is not the adapter's name (vLLM lists the adapter first, then the salt).
fn first_salt(s: &BlockStored) -> Option<String> {
    if let Some(salt) = &s.cache_salt {
        return Some(salt.clone()); // SGLang's metadata
    }
    let keys = s.extra_keys.as_ref()?.first()?.as_ref()?;
    let mut texts = keys.iter().filter_map(|k| match k {
        ExtraKey::Text(t) => Some(t.as_str()),
        ExtraKey::Other => None,
    });
    if s.lora_name.is_some() {
        texts.next();
    }
    texts.next().map(str::to_owned)
}

#[cfg(test)]
mod tests {
    use super::*;
    use prefix_core::block::block_hashes;

    fn bs(n: u32) -> BlockSize {
        BlockSize::new(n).unwrap_or_default()
    }

    fn stored(ids: &[u64], parent: Option<u64>, tokens: &[u32], size: u32) -> PodEvent {
        PodEvent::BlockStored(BlockStored {
            block_hashes: ids.iter().map(|&i| PodBlockId(i)).collect(),
            parent: parent.map(PodBlockId),
            token_ids: tokens.to_vec(),
            block_size: size,
            medium: Some("GPU".into()),
            ..BlockStored::default()
        })
    }

    fn removed(ids: &[u64]) -> PodEvent {
        PodEvent::BlockRemoved {
            block_hashes: ids.iter().map(|&i| PodBlockId(i)).collect(),
            medium: None,
            group_idx: None,
        }
    }

    fn hashes(events: &[CacheEvent]) -> Vec<BlockHash> {
        events
            .iter()
            .flat_map(|e| match e {
                CacheEvent::BlockStored { hashes } => hashes.clone(),
                _ => Vec::new(),
            })
            .collect()
    }

    #[test]
    fn same_block_size_gives_the_filters_hashes() {
        let tokens: Vec<u32> = (0..12).collect();
        let want = block_hashes(root_hash("m", None), &tokens, bs(4));
        let mut t = Translator::new("m", bs(4), 100);
        // two events, the second continuing the first through its parent
        let a = t.apply(&stored(&[10, 11], None, &tokens[..8], 4));
        let b = t.apply(&stored(&[12], Some(11), &tokens[8..], 4));
        let got = [
            hashes(&a.unwrap_or_default()),
            hashes(&b.unwrap_or_default()),
        ]
        .concat();
        assert_eq!(got, want);
        assert_eq!(t.held().len(), 3);
        // evicting the tail forgets exactly its router block
        let r = t.apply(&removed(&[12])).unwrap_or_default();
        assert_eq!(
            r,
            vec![CacheEvent::BlockRemoved {
                hashes: vec![want[2]]
            }]
        );
        assert_eq!(t.held().len(), 2);
    }

    #[test]
    fn router_blocks_of_several_pod_blocks() {
        // router blocks of 8 tokens, pod blocks of 2: one router block per 4 pod blocks
        let tokens: Vec<u32> = (100..124).collect();
        let want = block_hashes(root_hash("m", None), &tokens, bs(8));
        let mut t = Translator::new("m", bs(8), 100);
        // the pod reports its blocks in uneven batches: 3, 4, 5 pod blocks
        let mut got = Vec::new();
        let batches: [(&[u64], Option<u64>, std::ops::Range<usize>); 3] = [
            (&[1, 2, 3], None, 0..6),
            (&[4, 5, 6, 7], Some(3), 6..14),
            (&[8, 9, 10, 11, 12], Some(7), 14..24),
        ];
        for (ids, parent, range) in batches {
            got.extend(hashes(
                &t.apply(&stored(ids, parent, &tokens[range], 2))
                    .unwrap_or_default(),
            ));
        }
        assert_eq!(got, want);
        // a branch off the middle of the second router block: shares the first, not the second
        let mut other = tokens.clone();
        other[13] = 999;
        let want_other = block_hashes(root_hash("m", None), &other[..16], bs(8));
        let got = hashes(
            &t.apply(&stored(&[20, 21], Some(6), &other[12..16], 2))
                .unwrap_or_default(),
        );
        assert_eq!(got, vec![want_other[1]]);
        assert_eq!(want_other[0], want[0]);
        // removing a middle pod block forgets nothing the router can name; the completing one does
        assert!(t.apply(&removed(&[5])).unwrap_or_default().is_empty());
        assert_eq!(
            t.apply(&removed(&[8])).unwrap_or_default(),
            vec![CacheEvent::BlockRemoved {
                hashes: vec![want[1]]
            }]
        );
    }

    #[test]
    fn sizes_that_do_not_divide_are_refused() {
        let mut t = Translator::new("m", bs(128), 100);
        let e = t.apply(&stored(&[1], None, &[0; 48], 48));
        assert_eq!(
            e,
            Err(TranslateError::BlockSizes {
                pod: 48,
                router: 128
            })
        );
        let msg = TranslateError::BlockSizes {
            pod: 48,
            router: 128,
        }
        .to_string();
        assert!(
            msg.contains("48") && msg.contains("128") && msg.contains("block_size"),
            "{msg}"
        );
        // a pod block larger than the router's cannot be matched either
        assert!(t.apply(&stored(&[1], None, &[0; 256], 256)).is_err());
    }

    #[test]
    fn salts_and_adapters_seed_the_root_as_the_filter_does() {
        let tokens: Vec<u32> = (0..4).collect();
        let mut ev = BlockStored {
            block_hashes: vec![PodBlockId(1)],
            token_ids: tokens.clone(),
            block_size: 4,
            lora_name: Some("sql".into()),
            extra_keys: Some(vec![Some(vec![
                ExtraKey::Text("sql".into()),
                ExtraKey::Text("tenant-a".into()),
            ])]),
            ..BlockStored::default()
        };
        let mut t = Translator::new("m", bs(4), 100);
        let got = hashes(
            &t.apply(&PodEvent::BlockStored(ev.clone()))
                .unwrap_or_default(),
        );
        let root = root_hash(&model_seed("m", Some("sql")), Some("tenant-a"));
        assert_eq!(got, block_hashes(root, &tokens, bs(4)));
        // the salt alone
        ev.lora_name = None;
        ev.extra_keys = Some(vec![Some(vec![ExtraKey::Text("tenant-a".into())])]);
        ev.block_hashes = vec![PodBlockId(2)];
        let got = hashes(
            &t.apply(&PodEvent::BlockStored(ev.clone()))
                .unwrap_or_default(),
        );
        assert_eq!(
            got,
            block_hashes(root_hash("m", Some("tenant-a")), &tokens, bs(4))
        );
        // an adapter known by number only cannot be named: left out
        ev.lora_id = Some(3);
        ev.block_hashes = vec![PodBlockId(3)];
        assert!(t
            .apply(&PodEvent::BlockStored(ev))
            .unwrap_or_default()
            .is_empty());
    }

    #[test]
    fn what_cannot_be_named_is_left_out_with_its_descendants() {
        let tokens: Vec<u32> = (0..8).collect();
        let mut t = Translator::new("m", bs(4), 100);
        // unknown parent (stored before we listened)
        assert!(t
            .apply(&stored(&[2], Some(1), &tokens[4..], 4))
            .unwrap_or_default()
            .is_empty());
        assert!(t
            .apply(&stored(&[3], Some(2), &tokens[4..], 4))
            .unwrap_or_default()
            .is_empty());
        assert_eq!(t.skipped.unknown_parent, 2);
        // an offload tier's copy
        let PodEvent::BlockStored(mut cpu) = stored(&[5], None, &tokens[..4], 4) else {
            return;
        };
        cpu.medium = Some("CPU".into());
        assert!(t
            .apply(&PodEvent::BlockStored(cpu))
            .unwrap_or_default()
            .is_empty());
        // multimodal keys on the second block: the first is followed, the second is not
        let PodEvent::BlockStored(mut mm) = stored(&[6, 7], None, &tokens, 4) else {
            return;
        };
        mm.extra_keys = Some(vec![None, Some(vec![ExtraKey::Other])]);
        assert_eq!(
            hashes(&t.apply(&PodEvent::BlockStored(mm)).unwrap_or_default()).len(),
            1
        );
        assert!(t
            .apply(&stored(&[8], Some(7), &tokens[..4], 4))
            .unwrap_or_default()
            .is_empty());
    }

    #[test]
    fn clears_and_the_bound_forget_everything() {
        let tokens: Vec<u32> = (0..16).collect();
        let mut t = Translator::new("m", bs(4), 3);
        t.apply(&stored(&[1, 2], None, &tokens[..8], 4))
            .unwrap_or_default();
        assert_eq!(
            t.apply(&PodEvent::AllBlocksCleared).unwrap_or_default(),
            vec![CacheEvent::AllCleared]
        );
        assert!(t.held().is_empty());
        // over the bound: one AllCleared instead of a table that can only grow
        let out = t
            .apply(&stored(&[1, 2, 3, 4], None, &tokens, 4))
            .unwrap_or_default();
        assert_eq!(out, vec![CacheEvent::AllCleared]);
        assert_eq!((t.pod_blocks(), t.skipped.over_limit_resets), (0, 1));
        // the same block stored twice is held once, and one removal forgets it
        t.apply(&stored(&[1], None, &tokens[..4], 4))
            .unwrap_or_default();
        t.apply(&stored(&[1], None, &tokens[..4], 4))
            .unwrap_or_default();
        assert_eq!(t.held().len(), 1);
        assert_eq!(t.apply(&removed(&[1])).unwrap_or_default().len(), 1);
        assert!(t.held().is_empty());
    }
}
