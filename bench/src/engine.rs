//! The real engine's prefix-cache payoff: TTFT with 0–8 cached blocks, prefill and decode
//! speed, and memory per cached block (in-process, SmolLM2-135M on CPU). Prompts are
//! prefilled in the chunks the server's batching loop computes them in
//! ([`PREFILL_CHUNK`] tokens), so the figures are the server's own.

use gguf_engine::batcher::PREFILL_CHUNK;
use gguf_engine::kv::Kv;
use gguf_engine::llama::Llama;
use serde::Serialize;
use std::time::Instant;

#[derive(Debug, Serialize)]
pub struct EngineRow {
    pub cached_blocks: usize,
    pub prompt_tokens: usize,
    pub cold_ttft_ms: f64,
    pub warm_ttft_ms: f64,
    pub ratio: f64,
}

#[derive(Debug, Serialize)]
pub struct EngineResult {
    pub rows: Vec<EngineRow>,
    pub prefill_tokens_per_s: f64,
    pub decode_tokens_per_s: f64,
    /// Output tokens per second of all [`BATCH`] sequences decoding together (the batching
    /// loop's decode step, `Llama::forward_batch`), and that over `decode_tokens_per_s`.
    pub batched_decode_tokens_per_s: f64,
    pub batched_over_single: f64,
    pub bytes_per_block: usize,
}

/// Sequences in the batched decode measurement (issue 15's goal: 8 concurrent requests).
pub const BATCH: usize = 8;

/// Prompt tokens the decode speed is measured after.
pub const DECODE_AFTER: usize = 256;

/// Tokens the decode speed is measured over, here and for llama.cpp in the same run (64, as
/// llama.cpp's is: this engine's measured 32, so the two were not like for like and this
/// one's was a third of a second on a machine whose speed swings between runs).
pub const DECODE_STEPS: usize = 64;

/// Prefills `tokens` after the positions in `kv`, chunk by chunk as the batching loop does
/// (its chunks after a cached prefix start on a block boundary, as these do).
fn prefill(model: &Llama, tokens: &[u32], kv: &mut Kv) -> anyhow::Result<()> {
    for chunk in tokens.chunks(PREFILL_CHUNK) {
        model.forward(chunk, kv)?;
    }
    Ok(())
}

/// `ids` must hold at least 8 blocks + 16 tokens.
pub fn run(model: &Llama, ids: &[u32], block: usize) -> anyhow::Result<EngineResult> {
    let mut rows = Vec::new();
    let mut prefill_tokens = 0usize;
    let mut prefill_s = 0.0;
    let mut bytes_per_block = 0;
    for k in [1usize, 2, 4, 6, 8] {
        let n = k * block + 16;
        let prompt = &ids[..n];
        // cold: the whole prompt
        let t = Instant::now();
        let mut kv = model.empty_kv()?;
        prefill(model, prompt, &mut kv)?;
        let cold = t.elapsed().as_secs_f64();
        prefill_tokens += n;
        prefill_s += cold;
        // warm: k blocks from the cache, as the server assembles them, then the rest
        let blocks: Vec<Kv> = (0..k)
            .map(|b| kv.slice(b * block, block))
            .collect::<gguf_engine::Result<_>>()?;
        bytes_per_block = blocks[0].bytes();
        let t = Instant::now();
        let refs: Vec<&Kv> = blocks.iter().collect();
        let mut warm_kv = Kv::concat(&refs)?.ok_or_else(|| anyhow::anyhow!("no blocks"))?;
        prefill(model, &prompt[k * block..], &mut warm_kv)?;
        let warm = t.elapsed().as_secs_f64();
        rows.push(EngineRow {
            cached_blocks: k,
            prompt_tokens: n,
            cold_ttft_ms: cold * 1e3,
            warm_ttft_ms: warm * 1e3,
            ratio: warm / cold,
        });
    }
    // decode: one token at a time after a 256-token prompt, as the batching loop runs a
    // request decoding alone (a batch of one)
    let mut kv = model.empty_kv()?;
    prefill(model, &ids[..DECODE_AFTER], &mut kv)?;
    let t = Instant::now();
    let steps = DECODE_STEPS;
    for i in 0..steps {
        model.forward_batch(&mut [(ids[DECODE_AFTER + i], &mut kv)])?;
    }
    let decode = steps as f64 / t.elapsed().as_secs_f64();
    // batched decode: BATCH sequences, each after its own 256-token prompt, one step at a time
    let mut kvs = Vec::with_capacity(BATCH);
    for s in 0..BATCH {
        let mut kv = model.empty_kv()?;
        prefill(model, &ids[s..DECODE_AFTER + s], &mut kv)?;
        kvs.push(kv);
    }
    let t = Instant::now();
    for i in 0..steps {
        let mut batch: Vec<(u32, &mut Kv)> = kvs
            .iter_mut()
            .enumerate()
            .map(|(s, kv)| (ids[DECODE_AFTER + s + i], kv))
            .collect();
        model.forward_batch(&mut batch)?;
    }
    let batched = (steps * BATCH) as f64 / t.elapsed().as_secs_f64();
    Ok(EngineResult {
        rows,
        prefill_tokens_per_s: prefill_tokens as f64 / prefill_s,
        decode_tokens_per_s: decode,
        batched_decode_tokens_per_s: batched,
        batched_over_single: batched / decode,
        bytes_per_block,
    })
}

/// One pod over HTTP: output tokens per second of one request alone, and of [`BATCH`]
/// different requests sent at once (the batching loop's effect end to end: admission,
/// chunked prefill, batched decode, streaming the answers back).
#[derive(Debug, Serialize)]
pub struct Concurrency {
    pub prompt_tokens: usize,
    pub max_tokens: u32,
    pub alone_tokens_per_s: f64,
    pub together_tokens_per_s: f64,
    pub ratio: f64,
}

/// A candle pod (`--max-num-seqs` [`BATCH`]). `ids` must hold at least `BATCH + 32` tokens.
pub fn concurrency(ids: &[u32], dir: &std::path::Path) -> anyhow::Result<Concurrency> {
    let max = BATCH.to_string();
    let pods =
        test_harness::cluster::start_pods(1, &["--engine", "gguf", "--max-num-seqs", &max], dir)?;
    concurrency_at(&pods[0].addr, ids)
}

/// llama.cpp's `llama-server` on the same GGUF and both cores, with [`BATCH`] slots (its
/// continuous batching), measured the same way: the yardstick for the candle pod's ratio.
pub fn llama_cpp_concurrency(ids: &[u32], dir: &std::path::Path) -> anyhow::Result<Concurrency> {
    let slots = BATCH.to_string();
    let pods = test_harness::cluster::start_pods_of(
        test_harness::cluster::PodKind::LlamaCpp,
        1,
        &["--threads", "2", "--parallel", &slots],
        dir,
    )?;
    concurrency_at(&pods[0].addr, ids)
}

/// The measurement through a pod's OpenAI `/v1/completions` at `addr`.
fn concurrency_at(addr: &str, ids: &[u32]) -> anyhow::Result<Concurrency> {
    let url = format!("http://{addr}/v1/completions");
    let http = test_harness::cluster::client();
    let (prompt_tokens, max_tokens) = (32usize, 48u32);
    // completion tokens of one request (the model may end before max_tokens)
    let send = |i: usize| -> anyhow::Result<u64> {
        let body = serde_json::json!({
            "prompt": &ids[i..i + prompt_tokens],
            "max_tokens": max_tokens,
        });
        let v = crate::post_json(&http, &url, &body)?;
        v["usage"]["completion_tokens"]
            .as_u64()
            .ok_or_else(|| anyhow::anyhow!("no usage in {v}"))
    };
    send(BATCH)?; // warm-up (first use of every buffer)
    let t = Instant::now();
    let alone = send(0)? as f64 / t.elapsed().as_secs_f64();
    let t = Instant::now();
    let together: u64 = std::thread::scope(|s| {
        let handles: Vec<_> = (0..BATCH).map(|i| s.spawn(move || send(i))).collect();
        handles
            .into_iter()
            .map(|h| h.join().map_err(|_| anyhow::anyhow!("a sender panicked"))?)
            .sum::<anyhow::Result<u64>>()
    })?;
    let together = together as f64 / t.elapsed().as_secs_f64();
    Ok(Concurrency {
        prompt_tokens,
        max_tokens,
        alone_tokens_per_s: alone,
        together_tokens_per_s: together,
        ratio: together / alone,
    })
}
