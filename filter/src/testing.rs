//! Test support shared by the filter's unit tests.

use crate::router::Router;
use prefix_core::router_config::RouterConfig;
use prefix_core::{BlockSize, ModelBundle};

/// `tokenizer.json` of a byte-level tokenizer good enough for routing tests: each character
/// is a token.
pub fn tiny_tokenizer_json() -> String {
    let vocab: serde_json::Map<String, serde_json::Value> = (0u8..=255)
        .map(|b| (String::from(b as char), serde_json::json!(b)))
        .collect();
    let tok = serde_json::json!({
        "version": "1.0", "truncation": null, "padding": null, "added_tokens": [],
        "normalizer": null,
        // WordLevel needs a splitter: one token per character
        "pre_tokenizer": {"type": "Split", "pattern": {"Regex": "."}, "behavior": "Isolated", "invert": false},
        "post_processor": null, "decoder": null,
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "?"}
    });
    tok.to_string()
}

/// A bundle of [`tiny_tokenizer_json`].
pub fn tiny_bundle(block: u32) -> ModelBundle {
    ModelBundle::new(
        "m",
        tiny_tokenizer_json().as_bytes(),
        None,
        BlockSize::new(block).unwrap(),
    )
    .unwrap()
}

/// The pods of [`config`], in order.
pub const PODS: [&str; 3] = ["127.0.0.1:8001", "127.0.0.1:8002", "127.0.0.1:8003"];

/// Three pods, 4-token blocks, model `m`, plus `extra` config fields (a JSON object's inner
/// text, e.g. `"debug_headers":true`).
pub fn config(extra: &str) -> RouterConfig {
    let sep = if extra.is_empty() { "" } else { "," };
    let json = format!(
        r#"{{"pods":["127.0.0.1:8001","127.0.0.1:8002","127.0.0.1:8003"],"block_size":4,"model_name":"m","table_capacity":4096{sep}{extra}}}"#
    );
    RouterConfig::parse(json.as_bytes()).unwrap()
}

/// A router on [`config`] with the tiny tokenizer.
pub fn router(extra: &str) -> Router {
    Router::new(config(extra), Some(tiny_bundle(4)), 0)
}
