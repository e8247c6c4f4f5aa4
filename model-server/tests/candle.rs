//! The real engine (`--engine gguf`, SmolLM2-135M on CPU): a prefix-cache hit reuses the
//! blocks' real K/V and changes nothing in the answer.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use model_server::config::default_model_file;
use model_server::engine::llama::{Kv, Llama};
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

/// The real model and the token ids of `copies` runbooks.
fn model_and_runbook(copies: usize) -> (Llama, Vec<u32>) {
    let model = Llama::load(&default_model_file()).expect("run scripts/setup.sh");
    let bundle_json =
        std::fs::read(model_server::config::default_model_dir().join("tokenizer.json")).unwrap();
    let tok = prefix_core::tokenizer::Tokenizer::from_json_bytes(&bundle_json).unwrap();
    (model, tok.encode(&RUNBOOK.repeat(copies)).unwrap())
}

/// The index of the largest logit (greedy's choice).
fn argmax(v: &[f32]) -> u32 {
    v.iter()
        .enumerate()
        .max_by(|x, y| x.1.total_cmp(y.1))
        .unwrap()
        .0 as u32
}

/// The largest |got − want| over two logit vectors, and the scale it is judged against: the
/// largest |want|, at least 1.
fn diff_and_scale(got: &[f32], want: &[f32]) -> (f32, f32) {
    let diff = got
        .iter()
        .zip(want)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0f32, f32::max);
    (diff, want.iter().map(|x| x.abs()).fold(1.0f32, f32::max))
}

/// One decode step of one sequence (a batch of one, as the batching loop runs a request
/// decoding alone): its logits.
fn decode_alone(model: &Llama, token: u32, kv: &mut Kv) -> Vec<f32> {
    model
        .forward_batch(&mut [(token, kv)])
        .unwrap()
        .squeeze(0)
        .unwrap()
        .to_vec1::<f32>()
        .unwrap()
}

#[test]
fn logits_with_cached_blocks_equal_full_prefill() {
    let (model, ids) = model_and_runbook(3);
    let ids = &ids[..300];

    let mut full = model.empty_kv().unwrap();
    let a = model
        .forward(ids, &mut full)
        .unwrap()
        .to_vec1::<f32>()
        .unwrap();

    // blocks 0 and 1 from a run over the first 256 tokens, as the cache would hold them
    let mut first = model.empty_kv().unwrap();
    model.forward(&ids[..256], &mut first).unwrap();
    let b0 = first.slice(0, 128).unwrap();
    let b1 = first.slice(128, 128).unwrap();
    let mut kv = Kv::concat(&[&b0, &b1]).unwrap().unwrap();
    assert_eq!(kv.len(), 256);
    let b = model
        .forward(&ids[256..], &mut kv)
        .unwrap()
        .to_vec1::<f32>()
        .unwrap();
    assert_eq!(kv.len(), 300);

    let (max_diff, scale) = diff_and_scale(&b, &a);
    assert!(
        max_diff <= 1e-3 * scale,
        "logits differ by {max_diff} (scale {scale})"
    );
    assert_eq!(argmax(&a), argmax(&b));
    println!(
        "max |Δlogit| = {max_diff} (max |logit| {scale}); a block holds {} KiB",
        b0.bytes() / 1024
    );
}

/// Decoding several sequences in one batched step gives each the logits it gets alone, so a
/// pod that batches answers exactly as one that does not (greedy). Alone is a batch of one:
/// decode steps multiply by the same decode weights whatever the batch.
#[test]
fn a_batched_decode_step_equals_each_sequence_alone() {
    let (model, ids) = model_and_runbook(2);
    // three sequences of different lengths, so each attends over its own number of positions
    let prompts = [&ids[..40], &ids[5..70], &ids[11..23]];
    let prefill = |p: &[u32]| {
        let mut kv = model.empty_kv().unwrap();
        let logits = model.forward(p, &mut kv).unwrap().to_vec1::<f32>().unwrap();
        (kv, argmax(&logits))
    };
    // alone: by_step[step][sequence]
    let mut by_step: Vec<Vec<Vec<f32>>> = vec![Vec::new(); 6];
    for p in prompts {
        let (mut kv, mut next) = prefill(p);
        for rows in by_step.iter_mut() {
            let logits = decode_alone(&model, next, &mut kv);
            next = argmax(&logits);
            rows.push(logits);
        }
    }
    // together
    let mut seqs: Vec<(Kv, u32)> = prompts.iter().map(|p| prefill(p)).collect();
    for (step, wants) in by_step.iter().enumerate() {
        let mut batch: Vec<(u32, &mut Kv)> = seqs.iter_mut().map(|(kv, t)| (*t, kv)).collect();
        let logits = model
            .forward_batch(&mut batch)
            .unwrap()
            .to_vec2::<f32>()
            .unwrap();
        for (i, row) in logits.iter().enumerate() {
            let want = &wants[i];
            let (diff, scale) = diff_and_scale(row, want);
            assert!(
                diff <= 1e-3 * scale,
                "sequence {i} step {step}: logits differ by {diff}"
            );
            assert_eq!(argmax(row), argmax(want), "sequence {i} step {step}");
            seqs[i].1 = argmax(row);
        }
    }
    for (i, (kv, _)) in seqs.iter().enumerate() {
        assert_eq!(kv.len(), prompts[i].len() + 6);
    }
}

/// Prompt chunks of several sequences in one pass (the batching loop prefills the requests it
/// admits together) give each the logits and K/V it gets in a pass of its own: a fresh
/// prompt, a chunk after positions already held, and a short one.
#[test]
fn prompt_chunks_prefilled_together_equal_each_alone() {
    let (model, ids) = model_and_runbook(2);
    let held = |n: usize| {
        let mut kv = model.empty_kv().unwrap();
        if n > 0 {
            model.forward(&ids[..n], &mut kv).unwrap();
        }
        kv
    };
    let chunks: [(usize, &[u32]); 3] = [(0, &ids[..40]), (64, &ids[64..100]), (0, &ids[11..23])];
    let alone: Vec<(Vec<f32>, Vec<f32>)> = chunks
        .iter()
        .map(|&(before, chunk)| {
            let mut kv = held(before);
            let logits = model
                .forward(chunk, &mut kv)
                .unwrap()
                .to_vec1::<f32>()
                .unwrap();
            let next = decode_alone(&model, argmax(&logits), &mut kv);
            (logits, next)
        })
        .collect();
    let mut kvs: Vec<Kv> = chunks.iter().map(|&(before, _)| held(before)).collect();
    let mut parts: Vec<(&[u32], &mut Kv)> = chunks
        .iter()
        .zip(kvs.iter_mut())
        .map(|((_, c), kv)| (*c, kv))
        .collect();
    let together = model.forward_many(&mut parts).unwrap();
    assert_eq!(together.len(), 3);
    for (i, (logits, (want, want_next))) in together.iter().zip(&alone).enumerate() {
        let got = logits.to_vec1::<f32>().unwrap();
        let (diff, scale) = diff_and_scale(&got, want);
        assert!(diff <= 1e-3 * scale, "chunk {i}: logits differ by {diff}");
        assert_eq!(argmax(&got), argmax(want), "chunk {i}");
        // the K/V appended is the same too: the next step's logits agree
        assert_eq!(kvs[i].len(), chunks[i].0 + chunks[i].1.len());
        let next = decode_alone(&model, argmax(&got), &mut kvs[i]);
        let (diff, scale) = diff_and_scale(&next, want_next);
        assert!(
            diff <= 1e-3 * scale,
            "chunk {i}: the next step differs by {diff}"
        );
    }
    assert!(model.forward_many(&mut []).unwrap().is_empty());
}

/// A decode step (the GGUF's 4-bit values where it holds 4 bits, its 8-bit output matrix,
/// activations in 8 bits) stays close to the same position computed with the f32 weights
/// prefill uses, and picks the same greedy token, over a run of steps.
#[test]
fn decode_steps_agree_with_the_f32_weights() {
    let (model, ids) = model_and_runbook(1);
    // SmolLM2's Q4_1 layers re-encode exactly in 4 bits; its Q8_0 embedding (the output
    // matrix) does not, and stays in 8
    let bits = model.decode_bits();
    let (output, layers) = bits.split_last().unwrap();
    assert!(layers.iter().all(|&b| b == 4), "{bits:?}");
    assert_eq!(*output, 8);
    let mut kv = model.empty_kv().unwrap();
    let first = model
        .forward(&ids[..100], &mut kv)
        .unwrap()
        .to_vec1::<f32>()
        .unwrap();
    let mut next = argmax(&first);
    let mut worst = 0.0f32;
    for step in 0..8 {
        let mut f32_kv = kv.slice(0, kv.len()).unwrap();
        let want = model
            .forward(&[next], &mut f32_kv)
            .unwrap()
            .to_vec1::<f32>()
            .unwrap();
        let got = decode_alone(&model, next, &mut kv);
        let (diff, scale) = diff_and_scale(&got, &want);
        worst = worst.max(diff / scale);
        assert!(
            diff <= 0.08 * scale,
            "step {step}: logits differ by {diff} (scale {scale})"
        );
        assert_eq!(argmax(&got), argmax(&want), "step {step}");
        next = argmax(&got);
    }
    println!("largest |Δlogit| / max |logit| over 8 steps: {worst}");
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
