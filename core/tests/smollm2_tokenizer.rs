//! The default model's vocabulary, as written by `scripts/setup.sh` from the GGUF: special
//! tokens have the model's ids, text round-trips, and the chat template renders and
//! tokenizes as SmolLM2 expects.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use prefix_core::protocol::defaults;
use prefix_core::request::{parse_request, Endpoint};
use prefix_core::{BlockSize, ModelBundle};
use std::path::{Path, PathBuf};

fn model_dir() -> PathBuf {
    let repo = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/.."));
    defaults::model_dir(&defaults::data_dir(repo))
}

fn bundle() -> ModelBundle {
    let dir = model_dir();
    let json = std::fs::read(dir.join("tokenizer.json"))
        .unwrap_or_else(|e| panic!("{}: {e} — run scripts/setup.sh first", dir.display()));
    let cfg = std::fs::read(dir.join("tokenizer_config.json")).unwrap();
    ModelBundle::new(
        defaults::MODEL_NAME,
        &json,
        Some(&cfg),
        BlockSize::default(),
    )
    .unwrap()
}

#[test]
fn special_tokens_have_model_ids() {
    let b = bundle();
    let t = b.tokenizer();
    assert_eq!(t.token_to_id("<|endoftext|>"), Some(0));
    assert_eq!(t.token_to_id("<|im_start|>"), Some(1));
    assert_eq!(t.token_to_id("<|im_end|>"), Some(2));
    assert_eq!(t.vocab_size(), 49152);
    let ids = t.encode("<|im_start|>user\nhi<|im_end|>").unwrap();
    assert_eq!(ids.first(), Some(&1));
    assert_eq!(ids.last(), Some(&2));
}

#[test]
fn encode_decode_round_trips() {
    let b = bundle();
    let t = b.tokenizer();
    for text in [
        "Hello, world!",
        "  leading spaces and\ttabs\nnewlines\n\n",
        "Digits 1234567890 are split one by one.",
        "Ünïcödé — emoji 🚀 and 中文 text",
        "<|im_start|>system\nYou are helpful<|im_end|>\n",
    ] {
        let ids = t.encode(text).unwrap();
        assert_eq!(t.decode(&ids).unwrap(), text);
    }
    // SmolLM's pre-tokenizer splits digits individually
    let ids = t.encode("2024").unwrap();
    assert_eq!(ids.len(), 4);
}

#[test]
fn chat_renders_with_model_template() {
    let b = bundle();
    let req = parse_request(
        Endpoint::ChatCompletions,
        br#"{"messages":[{"role":"user","content":"What is 2+2?"}]}"#,
    )
    .unwrap();
    let text = b.render_chat(&req).unwrap().unwrap();
    assert_eq!(
        text,
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n"
    );
    let p = b.prepare(&req).unwrap();
    assert_eq!(p.tokens, b.tokenizer().encode(&text).unwrap());
    assert_eq!(p.tokens[0], 1);
}

#[test]
fn prepare_hashes_full_blocks_and_checks_model() {
    let b = bundle();
    let long = "The quick brown fox jumps over the lazy dog. ".repeat(40);
    let body = serde_json::json!({"prompt": long}).to_string();
    let req = parse_request(Endpoint::Completions, body.as_bytes()).unwrap();
    let p = b.prepare(&req).unwrap();
    assert_eq!(p.hashes.len(), p.tokens.len() / 128);
    assert!(p.hashes.len() >= 2);
    let wrong = parse_request(Endpoint::Completions, br#"{"model":"gpt-4","prompt":"x"}"#).unwrap();
    assert_eq!(b.prepare(&wrong).unwrap_err().status, 404);
    let bad_ids = parse_request(Endpoint::Completions, br#"{"prompt":[1,999999]}"#).unwrap();
    assert_eq!(b.prepare(&bad_ids).unwrap_err().status, 400);
}
