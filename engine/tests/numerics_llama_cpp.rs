//! The real engine checked against an independent implementation: llama.cpp's
//! `llama-server` on the same GGUF. For a fixed set of prompts, llama.cpp generates greedily
//! and reports its top-5 candidates at each position (`/completion` with `n_probs`); the
//! engine is fed the same tokens (teacher-forced, so one disagreement does not derail the
//! rest) and its own top-5 is compared position by position.
//!
//! Both run Q4_1 weights with their own kernels (llama.cpp quantizes activations to 8 bits
//! for its dot products; the engine keeps them in f32 for the 4-bit matrices, bf16 for a
//! prefill on AVX-512), so their logits differ by tenths of a nat and a near-tie may flip.
//! Each kernel level this CPU has is run in a process of its own (`ENGINE_KERNELS`).
//! Measured on this project's 2-core AMD EPYC (AVX-512 with BF16 and VNNI), 12 prompts × 24
//! positions: top-1 agreement portable 277/288 (96.2 %), AVX2 276 (95.8 %), AVX-512 273
//! (94.8 %); at every level each disagreement was where llama.cpp's own choice led its
//! runner-up by at most 0.36 nats; mean top-5 overlap 0.969; largest gap between the two's
//! log-probability of llama.cpp's choice 0.26–0.31. The thresholds below leave room for
//! other machines but not for a fault: a wrong scale, a mis-ordered block or a broken RoPE
//! flips clear choices and drops agreement far below them.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use gguf_engine::llama::Llama;
use serde_json::{json, Value};
use std::time::Duration;
use test_harness::paths::{default_gguf, default_model_dir};

/// Positions generated (and compared) per prompt.
const STEPS: usize = 24;
/// Candidates compared per position.
const TOP: usize = 5;
/// Fraction of positions at which both choose the same next token, at least.
const MIN_TOP1: f64 = 0.90;
/// The two may choose apart only where llama.cpp's choice leads its runner-up by less than
/// this (log-probability): a near-tie, within twice their largest measured gap.
const MAX_FLIPPED_LEAD: f64 = 0.75;
/// Mean share of llama.cpp's top-5 that is in the engine's top-5, at least.
const MIN_TOP5_OVERLAP: f64 = 0.9;
/// Largest difference between the two's log-probability of llama.cpp's chosen token.
const MAX_LOGPROB_GAP: f64 = 0.5;

const PROMPTS: [&str; 12] = [
    "The capital of France is",
    "You are the on-call assistant for the payments platform. Before answering, read the incident context carefully.",
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return",
    "Once upon a time, in a small village by the sea, there lived",
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nWhat is a prefix cache?<|im_end|>\n<|im_start|>assistant\n",
    "1, 2, 3, 4, 5, 6, 7,",
    "The three primary colours are red, yellow and",
    "SELECT name, email FROM users WHERE",
    "Photosynthesis is the process by which plants",
    "Rollback checklist:\n1. Confirm the affected service.\n2.",
    "In 1969, the Apollo 11 mission",
    "Les chats sont des animaux",
];

/// The top `n` token ids of `logits`, best first (ties by lower id).
fn top(logits: &[f32], n: usize) -> Vec<u32> {
    let mut ids: Vec<u32> = (0..logits.len() as u32).collect();
    ids.sort_by(|&a, &b| {
        logits[b as usize]
            .total_cmp(&logits[a as usize])
            .then(a.cmp(&b))
    });
    ids.truncate(n);
    ids
}

/// log-softmax of `logits` at `id`.
fn logprob(logits: &[f32], id: u32) -> f64 {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let sum: f64 = logits.iter().map(|&l| (l as f64 - max).exp()).sum();
    logits[id as usize] as f64 - max - sum.ln()
}

struct LlamaServer {
    child: std::process::Child,
    url: String,
}

impl Drop for LlamaServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn llama_server() -> LlamaServer {
    let port = test_harness::process::free_port().unwrap();
    let mut cmd = test_harness::llama::command(port, &[]).expect("llama-server (scripts/setup.sh)");
    let child = cmd
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("llama-server starts");
    let server = LlamaServer {
        child,
        url: format!("http://127.0.0.1:{port}"),
    };
    let health = format!("{}/health", server.url);
    assert!(
        test_harness::cluster::wait_healthy(&health, Duration::from_secs(120)),
        "llama-server never became ready"
    );
    server
}

/// One position of llama.cpp's greedy continuation.
struct Step {
    chosen: u32,
    logprob: f64,
    /// Its top-5 ids, best first.
    top: Vec<u32>,
    /// How far its choice leads its runner-up (log-probability).
    margin: f64,
}

/// llama.cpp's greedy continuation of `ids`, position by position.
fn llama_cpp_steps(url: &str, ids: &[u32]) -> Vec<Step> {
    let http = test_harness::cluster::client();
    let body = json!({"prompt": ids, "n_predict": STEPS, "n_probs": TOP, "temperature": 0,
                      "cache_prompt": false, "ignore_eos": true});
    let v: Value = http
        .post(format!("{url}/completion"))
        .json(&body)
        .send()
        .unwrap()
        .json()
        .unwrap();
    assert_eq!(v["tokens_evaluated"], ids.len(), "no BOS added: {v}");
    v["completion_probabilities"]
        .as_array()
        .unwrap_or_else(|| panic!("no completion_probabilities: {v}"))
        .iter()
        .map(|p| {
            let cands = p["top_logprobs"].as_array().unwrap();
            let lp = |i: usize| cands[i]["logprob"].as_f64().unwrap();
            Step {
                chosen: p["id"].as_u64().unwrap() as u32,
                logprob: p["logprob"].as_f64().unwrap(),
                top: cands
                    .iter()
                    .map(|t| t["id"].as_u64().unwrap() as u32)
                    .collect(),
                margin: lp(0) - lp(1),
            }
        })
        .collect()
}

/// What one kernel level measured.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct Agreement {
    positions: usize,
    same_top1: usize,
    /// Mean share of llama.cpp's top-5 in the engine's.
    overlap: f64,
    /// Largest |engine − llama.cpp| log-probability of llama.cpp's choice.
    worst_gap: f64,
    /// Largest lead llama.cpp's choice had where the two chose apart.
    worst_flip: f64,
}

/// The comparison, in this process (at the kernel level its environment allows), against
/// the llama-server at `url`.
fn agreement(url: &str) -> Agreement {
    let model = Llama::load(&default_gguf()).expect("run scripts/setup.sh");
    let json = std::fs::read(default_model_dir().join("tokenizer.json")).unwrap();
    let tok = prefix_core::tokenizer::Tokenizer::from_json_bytes(&json).unwrap();
    let (mut positions, mut same_top1) = (0usize, 0usize);
    let (mut overlap, mut worst_gap, mut worst_flip) = (0.0, 0.0f64, 0.0f64);
    for prompt in PROMPTS {
        let ids = tok.encode(prompt).unwrap();
        let steps = llama_cpp_steps(url, &ids);
        assert_eq!(steps.len(), STEPS, "{prompt:?}");
        let mut kv = model.empty_kv().unwrap();
        let mut logits = model
            .forward(&ids, &mut kv)
            .unwrap()
            .to_vec1::<f32>()
            .unwrap();
        let mut line = String::new();
        for step in &steps {
            let ours = top(&logits, TOP);
            positions += 1;
            if ours[0] == step.chosen {
                same_top1 += 1;
                line.push('.');
            } else {
                line.push('x');
                worst_flip = worst_flip.max(step.margin);
            }
            overlap += step.top.iter().filter(|t| ours.contains(t)).count() as f64
                / step.top.len().max(1) as f64;
            worst_gap = worst_gap.max((logprob(&logits, step.chosen) - step.logprob).abs());
            logits = model
                .forward(&[step.chosen], &mut kv)
                .unwrap()
                .to_vec1::<f32>()
                .unwrap();
        }
        println!("{line}  {prompt:?}");
    }
    Agreement {
        positions,
        same_top1,
        overlap: overlap / positions as f64,
        worst_gap,
        worst_flip,
    }
}

/// Environment of the child runs: the llama-server to ask.
const CHILD_URL_ENV: &str = "NUMERICS_LLAMA_SERVER";
/// The line a child prints its result on.
const RESULT_MARK: &str = "NUMERICS RESULT ";

/// One kernel level's comparison, run by [`the_engine_agrees_with_llama_cpp_at_every_kernel_level`]
/// in a process of its own (the level is chosen once per process).
#[test]
#[ignore]
fn one_kernel_level() {
    let url = std::env::var(CHILD_URL_ENV).expect("run by the parent test");
    let a = agreement(&url);
    println!("{RESULT_MARK}{}", serde_json::to_string(&a).unwrap());
}

#[test]
fn the_engine_agrees_with_llama_cpp_at_every_kernel_level() {
    use gguf_engine::cpu::{self, KERNELS_ENV};
    let server = llama_server();
    for level in cpu::supported() {
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["one_kernel_level", "--exact", "--ignored", "--nocapture"])
            .env(KERNELS_ENV, level.to_string())
            .env(CHILD_URL_ENV, &server.url)
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        let a: Agreement = stdout
            .lines()
            .find_map(|l| l.strip_prefix(RESULT_MARK))
            .map(|j| serde_json::from_str(j).unwrap())
            .unwrap_or_else(|| {
                panic!(
                    "{level}: no result\n{stdout}{}",
                    String::from_utf8_lossy(&out.stderr)
                )
            });
        let top1 = a.same_top1 as f64 / a.positions as f64;
        println!(
            "{level}: top-1 agreement {}/{} ({:.1} %), mean top-{TOP} overlap {:.3}, largest log-probability gap {:.3}, largest llama.cpp lead where the two chose apart {:.3}",
            a.same_top1, a.positions, top1 * 100.0, a.overlap, a.worst_gap, a.worst_flip
        );
        assert!(
            top1 >= MIN_TOP1,
            "{level}: top-1 agreement {top1:.3} < {MIN_TOP1}"
        );
        assert!(
            a.overlap >= MIN_TOP5_OVERLAP,
            "{level}: top-{TOP} overlap {:.3} < {MIN_TOP5_OVERLAP}",
            a.overlap
        );
        assert!(
            a.worst_flip < MAX_FLIPPED_LEAD,
            "{level}: a clear choice flipped: llama.cpp led by {:.3}",
            a.worst_flip
        );
        assert!(
            a.worst_gap <= MAX_LOGPROB_GAP,
            "{level}: log-probability gap {:.3} > {MAX_LOGPROB_GAP}",
            a.worst_gap
        );
    }
}
