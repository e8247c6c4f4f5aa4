//! The engine's forward passes on the real model (SmolLM2-135M on CPU): K/V cut into blocks
//! and joined again, batched decode steps and prompt chunks prefilled together all give the
//! logits of the plain computation.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use gguf_engine::kv::Kv;
use gguf_engine::llama::Llama;
use test_harness::paths::{default_gguf, default_model_dir};

/// The runbook lead-in shared by the tests, plus an incident.
const RUNBOOK: &str = concat!(
    include_str!("../../test-data/runbook.txt"),
    "The checkout API returns HTTP 502 for twelve percent of requests in eu-west-1. "
);

/// The real model and the token ids of `copies` runbooks.
fn model_and_runbook(copies: usize) -> (Llama, Vec<u32>) {
    let model = Llama::load(&default_gguf()).expect("run scripts/setup.sh");
    let bundle_json = std::fs::read(default_model_dir().join("tokenizer.json")).unwrap();
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
