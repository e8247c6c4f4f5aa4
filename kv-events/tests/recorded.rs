//! Messages recorded from a real vLLM 0.32 (`tests/data/vllm-0.32`, by `record_vllm.py`: a
//! 20-block cache, so later prompts evict earlier ones) and made in SGLang's layout
//! (`tests/data/sglang`, by `sglang_messages.py`), decoded and translated.

use kv_events::translate::Translator;
use kv_events::wire::{self, PodEvent};
use prefix_core::block::{block_hashes, root_hash};
use prefix_core::protocol::CacheEvent;
use prefix_core::{BlockHash, BlockSize};
use std::collections::HashSet;
use std::path::Path;

fn data(dir: &str) -> Vec<(u64, Vec<u8>)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(dir);
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .map(|d| d.filter_map(Result::ok).map(|e| e.path()).collect())
        .unwrap_or_default();
    files.retain(|p| p.extension().is_some_and(|e| e == "payload"));
    files.sort();
    assert!(!files.is_empty(), "no messages in {}", dir.display());
    files
        .iter()
        .map(|p| {
            let n = p
                .file_stem()
                .and_then(|s| s.to_str())
                .and_then(|s| s.parse().ok())
                .unwrap_or(u64::MAX);
            (n, std::fs::read(p).unwrap_or_default())
        })
        .collect()
}

fn bs(n: u32) -> BlockSize {
    BlockSize::new(n).unwrap_or_default()
}

#[test]
fn vllm_messages_give_the_routers_hashes_and_follow_evictions() {
    let mut t = Translator::new("smollm2", bs(128), 10_000);
    let (mut stored, mut removed) = (Vec::<BlockHash>::new(), Vec::<BlockHash>::new());
    let mut salted = 0;
    for (n, payload) in data("vllm-0.32") {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/vllm-0.32");
        let seq = std::fs::read(dir.join(format!("{n:03}.seq"))).unwrap_or_default();
        let m = wire::decode(&[b"kv", &seq, &payload]).unwrap_or_else(|e| panic!("{n}: {e}"));
        assert_eq!(m.seq, n, "the publisher numbers messages from 0");
        for e in &m.events {
            if let PodEvent::BlockStored(s) = e {
                assert_eq!(s.block_size, 128);
                assert_eq!(s.token_ids.len(), 128 * s.block_hashes.len());
                // what the filter computes for these tokens (the salt is the request's)
                let salt = s
                    .extra_keys
                    .as_ref()
                    .and_then(|k| k.first()?.as_ref()?.first())
                    .map(|k| match k {
                        wire::ExtraKey::Text(t) => t.clone(),
                        wire::ExtraKey::Other => String::new(),
                    });
                salted += usize::from(salt.is_some());
                let want =
                    block_hashes(root_hash("smollm2", salt.as_deref()), &s.token_ids, bs(128));
                let got: Vec<BlockHash> = t
                    .apply(e)
                    .unwrap_or_default()
                    .into_iter()
                    .flat_map(|c| match c {
                        CacheEvent::BlockStored { hashes } => hashes,
                        _ => Vec::new(),
                    })
                    .collect();
                assert_eq!(got, want, "message {n}");
                stored.extend(got);
            } else {
                for c in t.apply(e).unwrap_or_default() {
                    match c {
                        CacheEvent::BlockRemoved { hashes } => removed.extend(hashes),
                        other => panic!("message {n}: unexpected {other:?}"),
                    }
                }
            }
        }
    }
    assert_eq!(salted, 1, "the recording has one salted request");
    // every eviction named a block the translator had been told of, and the held set is
    // exactly what was stored and not evicted
    assert!(!removed.is_empty(), "the recording evicts");
    let stored_set: HashSet<_> = stored.iter().copied().collect();
    assert!(removed.iter().all(|h| stored_set.contains(h)));
    let held: HashSet<_> = t.held().into_iter().collect();
    let want: HashSet<_> = stored_set
        .difference(&removed.iter().copied().collect())
        .copied()
        .collect();
    assert_eq!(held, want);
    assert!(
        held.len() <= 20,
        "the pod's cache holds 20 blocks, the router thinks {}",
        held.len()
    );
}

#[test]
fn sglang_messages_in_its_array_layout() {
    // SGLang's 4-token pages under an 8-token router block
    let mut t = Translator::new("m", bs(8), 10_000);
    let mut out = Vec::new();
    for (n, payload) in data("sglang") {
        let m =
            wire::decode(&[b"", &n.to_be_bytes(), &payload]).unwrap_or_else(|e| panic!("{n}: {e}"));
        for e in &m.events {
            out.push(t.apply(e).unwrap_or_else(|e| panic!("{n}: {e}")));
        }
    }
    let tokens: Vec<u32> = (100..116).collect();
    let plain = block_hashes(root_hash("m", None), &tokens, bs(8));
    let salted = block_hashes(root_hash("m", Some("tenant-a")), &tokens[..8], bs(8));
    assert_eq!(
        out,
        vec![
            // pages 11+12 make the first router block, 13+14 (continuing 12) the second
            vec![CacheEvent::BlockStored {
                hashes: vec![plain[0]]
            }],
            vec![CacheEvent::BlockStored {
                hashes: vec![plain[1]]
            }],
            // the salted chain is another tenant's: a different root
            vec![CacheEvent::BlockStored { hashes: salted }],
            // host-memory copies are not the pod's cache
            vec![],
            // evicting page 14 evicts the router block it completed
            vec![CacheEvent::BlockRemoved {
                hashes: vec![plain[1]]
            }],
            vec![CacheEvent::AllCleared],
        ]
    );
}
