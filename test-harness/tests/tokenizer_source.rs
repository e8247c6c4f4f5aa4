//! The tokenizer from configuration instead of the build: Envoy serves a model directory's
//! `tokenizer.json` and `tokenizer_config.json` from local files, the filter fetches them when
//! it starts and then routes by prefix with hashes equal to the pods'; a source that is broken
//! costs no request (balanced by load, reason `fallback`, logged and counted).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use serde_json::{json, Value};
use std::time::Duration;
use test_harness::fleet::{Fleet, ZERO_COST};
use test_harness::process::free_port;

const RUNBOOK: &str = include_str!("../../test-data/runbook.txt");

fn fleet(name: &str, dir: std::path::PathBuf) -> Fleet {
    let assets = free_port().unwrap();
    Fleet::start(name, 3, &ZERO_COST, |s| {
        s.tokenizer_dir = Some(dir);
        s.assets_port = assets;
        s.poll_interval_ms = 200;
    })
    .unwrap()
}

fn chat() -> Value {
    json!({"messages": [
        {"role": "system", "content": RUNBOOK},
        {"role": "user", "content": "The checkout API returns 502s in eu-west-1. Where do I start?"},
    ], "max_tokens": 1})
}

#[test]
fn a_tokenizer_served_by_envoy_is_fetched_and_routes_by_prefix() {
    let f = fleet(
        "tokenizer-fetched",
        test_harness::paths::default_model_dir(),
    );
    // every worker VM fetches its own copy on its first tick; until then, by load
    let routed = f.wait(Duration::from_secs(20), || {
        (0..4).all(|i| {
            let body = json!({"prompt": format!("warm-up {i} {RUNBOOK}"), "max_tokens": 1});
            f.send("/v1/completions", &body, &[]).reason() != "fallback"
        })
    });
    assert!(routed, "the filter never routed with the fetched tokenizer");
    assert!(f.stat(&f.envoy, "prefix_router_tokenizer_loaded") == 1.0);
    assert!(f
        .envoy
        .proc
        .log_tail()
        .contains("loaded from cluster 'prefix_router_assets'"));
    // the chat template came too: the filter's hash of a chat prompt is the pod's
    let first = f.send("/v1/chat/completions", &chat(), &[]);
    assert_eq!(first.status, 200, "{}", first.body);
    assert_eq!(
        json!(first.header("x-prefix-router-prefix-hash")),
        f.pod_prefix_hash(&chat())
    );
    let again = f.send("/v1/chat/completions", &chat(), &[]);
    assert_eq!(
        (again.reason(), again.pod.as_str()),
        ("prefix-hit", first.pod.as_str())
    );
    assert!(again.cached() > 0);
}

#[test]
fn a_broken_tokenizer_source_costs_no_request() {
    let dir = test_harness::cluster::run_dir("broken-tokenizer");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("tokenizer.json"), "{ this is not a tokenizer").unwrap();
    let f = fleet("tokenizer-broken", dir);
    // every worker VM tried, and failed
    assert!(f.wait(Duration::from_secs(10), || f
        .stat(&f.envoy, "prefix_router_tokenizer_load_failures")
        >= 2.0));
    for i in 0..6 {
        let body = json!({"prompt": format!("{i} {RUNBOOK}"), "max_tokens": 1});
        let a = f.send("/v1/completions", &body, &[]);
        assert_eq!((a.status, a.reason()), (200, "fallback"), "{}", a.body);
    }
    assert_eq!(f.stat(&f.envoy, "prefix_router_tokenizer_loaded"), 0.0);
    assert!(f.envoy.proc.log_tail().contains("not loaded (unusable"));
}

/// A model that keeps its chat template in `chat_template.jinja` (Hugging Face's newer
/// layout; its `tokenizer_config.json` has none): Envoy serves the file, the filter fetches
/// it, and pods given the same directory render with it, so chat prompts hash alike and
/// stick. Without the file the filter could not render them at all (reason `fallback`).
#[test]
fn a_chat_template_in_its_own_file_is_fetched_and_used() {
    let src = test_harness::paths::default_model_dir();
    let dir = test_harness::cluster::run_dir("jinja-model");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(src.join("tokenizer.json"), dir.join("tokenizer.json")).unwrap();
    let mut cfg: Value =
        serde_json::from_slice(&std::fs::read(src.join("tokenizer_config.json")).unwrap()).unwrap();
    let template = cfg
        .as_object_mut()
        .unwrap()
        .remove("chat_template")
        .unwrap();
    std::fs::write(dir.join("tokenizer_config.json"), cfg.to_string()).unwrap();
    // a template of its own: the built-in one behind a line of its own
    let jinja = format!("[from chat_template.jinja]\n{}", template.as_str().unwrap());
    std::fs::write(dir.join("chat_template.jinja"), jinja).unwrap();
    let mut pod_args = ZERO_COST.to_vec();
    let tokenizer = dir.display().to_string();
    pod_args.extend(["--tokenizer", tokenizer.as_str()]);
    let assets = free_port().unwrap();
    let f = Fleet::start("tokenizer-jinja", 3, &pod_args, |s| {
        s.tokenizer_dir = Some(dir.clone());
        s.assets_port = assets;
        s.poll_interval_ms = 200;
    })
    .unwrap();
    let rendered = f.tokenize(&chat());
    assert!(rendered["count"].as_u64().unwrap() > 0, "{rendered}");
    let routed = f.wait(Duration::from_secs(20), || {
        (0..4).all(|_| f.send("/v1/chat/completions", &chat(), &[]).reason() != "fallback")
    });
    assert!(
        routed,
        "the filter never rendered chat with the fetched template"
    );
    let first = f.send("/v1/chat/completions", &chat(), &[]);
    assert_eq!(
        json!(first.header("x-prefix-router-prefix-hash")),
        f.pod_prefix_hash(&chat()),
        "the filter and the pods render with the same file"
    );
    assert!(f
        .envoy
        .proc
        .log_tail()
        .contains("bytes of chat_template.jinja"));
    let again = f.send("/v1/chat/completions", &chat(), &[]);
    assert_eq!(again.reason(), "prefix-hit");
}

/// A model directory whose `tokenizer.json` is no byte-level BPE: a word-level vocabulary
/// (lower-cased, split on white space and punctuation) of the runbook's words, standing in for
/// the SentencePiece-style families the default .wasm does not encode either.
fn word_level_model() -> std::path::PathBuf {
    let dir = test_harness::cluster::run_dir("word-level-model");
    std::fs::create_dir_all(&dir).unwrap();
    let mut vocab = serde_json::Map::new();
    vocab.insert("[UNK]".into(), json!(0));
    for word in RUNBOOK
        .to_lowercase()
        .split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
    {
        let next = vocab.len();
        vocab.entry(word.to_owned()).or_insert(json!(next));
    }
    let tokenizer = json!({
        "version": "1.0", "truncation": null, "padding": null,
        "added_tokens": [{"id": 0, "content": "[UNK]", "single_word": false, "lstrip": false,
            "rstrip": false, "normalized": false, "special": true}],
        "normalizer": {"type": "Lowercase"},
        "pre_tokenizer": {"type": "Whitespace"},
        "post_processor": null,
        "decoder": null,
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "[UNK]"},
    });
    std::fs::write(dir.join("tokenizer.json"), tokenizer.to_string()).unwrap();
    dir
}

/// A vocabulary outside the byte-level BPE families: the default .wasm cannot encode it, logs
/// it as unusable and balances by load; the filter built with the `tokenizers` crate
/// (`scripts/build-filter.sh --full`) routes it by prefix, hashing as the pods do.
#[test]
fn another_kind_of_vocabulary_needs_the_full_build_and_routes_with_it() {
    let dir = word_level_model();
    let tokenizer = dir.display().to_string();
    let mut pod_args = ZERO_COST.to_vec();
    pod_args.extend(["--tokenizer", tokenizer.as_str()]);
    // words are fewer tokens than byte-level pieces: three runbooks for several full blocks
    let body = json!({"prompt": RUNBOOK.repeat(3), "max_tokens": 1});
    let start = |name: &str, wasm: std::path::PathBuf| {
        let assets = free_port().unwrap();
        Fleet::start(name, 2, &pod_args, |s| {
            s.tokenizer_dir = Some(dir.clone());
            s.assets_port = assets;
            s.poll_interval_ms = 200;
            s.wasm = Some(wasm);
        })
        .unwrap()
    };

    let small = start("word-level-default", test_harness::paths::wasm_path());
    assert!(small.wait(Duration::from_secs(10), || small
        .stat(&small.envoy, "prefix_router_tokenizer_load_failures")
        >= 2.0));
    for _ in 0..3 {
        let a = small.send("/v1/completions", &body, &[]);
        assert_eq!((a.status, a.reason()), (200, "fallback"), "{}", a.body);
    }
    assert!(small
        .envoy
        .proc
        .log_tail()
        .contains("scripts/build-filter.sh --full"));
    drop(small);

    let full = start("word-level-full", test_harness::paths::full_wasm_path());
    assert_eq!(
        full.stat(&full.envoy, "prefix_router_tokenizer_loaded"),
        1.0
    );
    let first = full.send("/v1/completions", &body, &[]);
    assert_eq!(first.status, 200, "{}", first.body);
    assert_ne!(first.reason(), "fallback");
    assert_eq!(
        json!(first.header("x-prefix-router-prefix-hash")),
        full.pod_prefix_hash(&body),
        "the filter and the pods tokenize alike"
    );
    let again = full.send("/v1/completions", &body, &[]);
    assert_eq!(
        (again.reason(), again.pod.as_str()),
        ("prefix-hit", first.pod.as_str())
    );
}
