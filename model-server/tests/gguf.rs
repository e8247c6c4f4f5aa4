//! The server on the real engine (`--engine gguf`, SmolLM2-135M on CPU): a prefix-cache hit
//! reuses the blocks' real K/V and changes nothing in the answer. The forward passes
//! themselves are checked in `engine/tests/llama.rs`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use serde_json::{json, Value};

/// The runbook lead-in shared by the tests, plus an incident.
const RUNBOOK: &str = concat!(
    include_str!("../../test-data/runbook.txt"),
    "The checkout API returns HTTP 502 for twelve percent of requests in eu-west-1. "
);

mod common;

use common::{start_with, Server};

async fn start(extra: &[&str]) -> Server {
    let mut flags = vec!["--engine", "gguf", "--pod-name", "real"];
    flags.extend_from_slice(extra);
    start_with(&flags).await
}

/// (answer text, cached tokens)
async fn complete(s: &Server, path: &str, body: &Value) -> (String, u64) {
    let (status, v, _) = s.post(path, body).await;
    assert_eq!(status, 200, "{v}");
    let c = &v["choices"][0];
    let text = c["text"]
        .as_str()
        .or_else(|| c["message"]["content"].as_str())
        .unwrap()
        .to_owned();
    (
        text,
        v["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap(),
    )
}

async fn tokens(s: &Server, text: &str) -> Vec<u64> {
    let (_, v, _) = s.post("/tokenize", &json!({ "prompt": text })).await;
    v["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_u64().unwrap())
        .collect()
}

#[tokio::test]
async fn cache_hits_do_not_change_greedy_answers() {
    let cached = start(&[]).await;
    let uncached = start(&["--cache-blocks", "0"]).await;
    let ids = tokens(&cached, &format!("{RUNBOOK}{RUNBOOK}{RUNBOOK}")).await;
    assert!(ids.len() > 410);
    // 1, 2 and 3 blocks plus a partial block (each starting elsewhere, so they share nothing)
    for (start, n) in [(0usize, 140usize), (3, 270), (7, 400)] {
        let body = json!({"prompt": &ids[start..start + n], "max_tokens": 8});
        let (reference, c0) = complete(&uncached, "/v1/completions", &body).await;
        assert_eq!(c0, 0);
        let (miss, c1) = complete(&cached, "/v1/completions", &body).await;
        let (hit, c2) = complete(&cached, "/v1/completions", &body).await;
        assert_eq!(c1, 0, "{n} tokens: first send is a miss");
        assert_eq!(
            c2,
            (n / 128 * 128) as u64,
            "{n} tokens: every full block reused"
        );
        assert_eq!(miss, reference, "{n} tokens");
        assert_eq!(
            hit, reference,
            "{n} tokens: the hit must not change the answer"
        );
        assert!(!hit.is_empty());
    }
    // chat
    let chat = json!({"messages": [
        {"role": "system", "content": RUNBOOK},
        {"role": "user", "content": "What should I check first?"},
    ], "max_tokens": 8});
    let (reference, _) = complete(&uncached, "/v1/chat/completions", &chat).await;
    let (_, _) = complete(&cached, "/v1/chat/completions", &chat).await;
    let (hit, c) = complete(&cached, "/v1/chat/completions", &chat).await;
    assert!(c >= 128);
    assert_eq!(hit, reference);

    // a prompt sharing only the first block reuses exactly one block
    let mut other = ids[7..277].to_vec();
    for t in other.iter_mut().skip(128) {
        *t = (*t + 7) % 40_000 + 20;
    }
    let body = json!({"prompt": other, "max_tokens": 6});
    let (reference, _) = complete(&uncached, "/v1/completions", &body).await;
    let (hit, c) = complete(&cached, "/v1/completions", &body).await;
    assert_eq!(c, 128);
    assert_eq!(hit, reference);
    cached.shutdown().await;
    uncached.shutdown().await;
}

#[tokio::test]
async fn eviction_under_tiny_capacity_never_corrupts_answers() {
    let tiny = start(&["--cache-blocks", "2"]).await;
    let uncached = start(&["--cache-blocks", "0"]).await;
    let ids = tokens(&tiny, &format!("{RUNBOOK}{RUNBOOK}{RUNBOOK}")).await;
    let a = json!({"prompt": &ids[..300], "max_tokens": 6});
    let b = json!({"prompt": &ids[40..340], "max_tokens": 6});
    let ra = complete(&uncached, "/v1/completions", &a).await.0;
    let rb = complete(&uncached, "/v1/completions", &b).await.0;
    for (body, reference) in [
        (&a, &ra),
        (&b, &rb),
        (&a, &ra),
        (&a, &ra),
        (&b, &rb),
        (&b, &rb),
    ] {
        assert_eq!(&complete(&tiny, "/v1/completions", body).await.0, reference);
    }
    // bad input and limits behave as with the sim engine
    let (s, v, _) = tiny.post("/v1/completions", &json!({"prompt": ""})).await;
    assert_eq!(s, 400, "{v}");
    let (s, _, _) = tiny
        .post("/v1/completions", &json!({"model": "nope", "prompt": "x"}))
        .await;
    assert_eq!(s, 404);
    // streaming with the real engine ends with [DONE]
    let r = tiny
        .http
        .post(format!("http://{}/v1/completions", tiny.addr))
        .json(&json!({"prompt": "The capital of France is", "max_tokens": 4, "stream": true}))
        .send()
        .await
        .unwrap();
    assert!(r.text().await.unwrap().trim_end().ends_with("data: [DONE]"));
    tiny.shutdown().await;
    uncached.shutdown().await;
}

/// Requests that run at once share the batching loop's steps (one of them still prefilling
/// in chunks while the others decode) and each still gets exactly the answer it gets alone,
/// streamed or not.
#[tokio::test]
async fn concurrent_requests_answer_as_they_do_alone() {
    let s = start(&["--max-num-seqs", "4", "--cache-blocks", "0"]).await;
    let ids = tokens(&s, &format!("{RUNBOOK}{RUNBOOK}{RUNBOOK}")).await;
    // prompts of different lengths (one longer than a prefill chunk), different max_tokens
    let bodies: Vec<Value> = [
        (0usize, 30usize, 10u32),
        (3, 300, 6),
        (9, 90, 12),
        (20, 12, 3),
    ]
    .iter()
    .map(|&(start, n, max)| json!({"prompt": &ids[start..start + n], "max_tokens": max}))
    .collect();
    // engine steps and the tokens they computed (vllm:iteration_tokens_total), so far
    let steps = || s.histogram("vllm:iteration_tokens_total");
    let mut alone = Vec::new();
    for b in &bodies {
        alone.push(complete(&s, "/v1/completions", b).await.0);
    }
    let after_alone = steps().await;
    let together =
        futures::future::join_all(bodies.iter().map(|b| complete(&s, "/v1/completions", b))).await;
    for (i, (text, _)) in together.iter().enumerate() {
        assert_eq!(text, &alone[i], "request {i}");
        assert!(!text.is_empty());
    }
    // the same tokens computed in fewer steps: steps were shared
    let after_together = steps().await;
    let (alone_steps, alone_tokens) = after_alone;
    let (together_steps, together_tokens) = (
        after_together.0 - after_alone.0,
        after_together.1 - after_alone.1,
    );
    assert_eq!(together_tokens, alone_tokens, "tokens computed");
    assert!(
        together_steps < alone_steps,
        "{together_steps} steps together, {alone_steps} alone"
    );
    s.shutdown().await;
}
