//! Golden hash vectors: fixed token ids → fixed block hashes, checked in. Any component (the
//! wasm filter, the server, another language) that reproduces these computes the same hashes.
//! Regenerate only on a deliberate scheme change: `GOLDEN_REGENERATE=1 cargo test -p prefix-core`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use prefix_core::block::{block_hashes, root_hash, BlockHash, BlockSize};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize)]
struct Case {
    model: String,
    cache_salt: Option<String>,
    block_size: u32,
    tokens: Vec<u32>,
    root: BlockHash,
    hashes: Vec<BlockHash>,
}

fn cases() -> Vec<Case> {
    let mk = |model: &str, salt: Option<&str>, bs: u32, tokens: Vec<u32>| {
        let root = root_hash(model, salt);
        Case {
            model: model.into(),
            cache_salt: salt.map(Into::into),
            block_size: bs,
            hashes: block_hashes(root, &tokens, BlockSize::new(bs).unwrap()),
            root,
            tokens,
        }
    };
    vec![
        mk("SmolLM2-135M-Instruct", None, 4, (0..10).collect()),
        mk(
            "SmolLM2-135M-Instruct",
            Some("tenant-a"),
            4,
            (0..10).collect(),
        ),
        mk(
            "SmolLM2-135M-Instruct",
            None,
            128,
            (0..300).map(|i| (i * 7919) % 49152).collect(),
        ),
        mk(
            "other-model",
            None,
            128,
            (0..300).map(|i| (i * 7919) % 49152).collect(),
        ),
        mk("SmolLM2-135M-Instruct", None, 128, (0..127).collect()),
    ]
}

const PATH: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/golden_hashes.json");

#[test]
fn golden_vectors_match() {
    if std::env::var_os("GOLDEN_REGENERATE").is_some() {
        std::fs::write(PATH, serde_json::to_string_pretty(&cases()).unwrap()).unwrap();
    }
    let stored: Vec<Case> = serde_json::from_str(&std::fs::read_to_string(PATH).unwrap()).unwrap();
    assert_eq!(stored.len(), cases().len());
    for c in &stored {
        let root = root_hash(&c.model, c.cache_salt.as_deref());
        assert_eq!(root, c.root, "root for {} / {:?}", c.model, c.cache_salt);
        let got = block_hashes(root, &c.tokens, BlockSize::new(c.block_size).unwrap());
        assert_eq!(
            got, c.hashes,
            "hashes for {} / {:?} / bs {}",
            c.model, c.cache_salt, c.block_size
        );
    }
    // sanity on the vectors themselves: salts separate, partial blocks are not hashed
    assert_ne!(stored[0].hashes, stored[1].hashes);
    assert_eq!(stored[0].hashes.len(), 2);
    assert_eq!(stored[2].hashes.len(), 2);
    assert!(stored[4].hashes.is_empty());
}
