//! `bench engine`: the real engine's TTFT cold vs warm, prefill/decode speed and batching,
//! beside llama.cpp on the same model and cores.

use super::{Args, Summary};
use crate::{engine, micro};
use prefix_core::model::ModelBundle;

/// Runs it; what it measured, for the summary.
pub fn run(_a: &Args, bundle: &ModelBundle) -> anyhow::Result<Summary> {
    let mut out = serde_json::Map::new();
    println!("== real engine (candle, SmolLM2-135M Q4_1, CPU): TTFT cold vs with cached blocks");
    let model = gguf_engine::llama::Llama::load(&model_server::config::default_model_file())?;
    let text = micro::text_of(bundle, 8 * 128 + 300)?;
    let ids = bundle.tokenizer().encode(&text)?;
    let r = engine::run(&model, &ids, 128)?;
    println!("   cached blocks  prompt tokens  cold TTFT  warm TTFT  warm/cold");
    for row in &r.rows {
        println!(
            "   {:>13}  {:>13}  {:>7.0}ms  {:>7.0}ms  {:>9.2}",
            row.cached_blocks, row.prompt_tokens, row.cold_ttft_ms, row.warm_ttft_ms, row.ratio
        );
    }
    if let Some(six) = r.rows.iter().find(|x| x.cached_blocks == 6) {
        println!(
            "   goal: 6 cached blocks TTFT ≤ 0.1× cold: {:.2} ({})",
            six.ratio,
            if six.ratio <= 0.1 { "met" } else { "MISSED" }
        );
    }
    println!(
        "   prefill {:.0} tokens/s, decode {:.1} tokens/s, {:.1} MiB per cached block",
        r.prefill_tokens_per_s,
        r.decode_tokens_per_s,
        r.bytes_per_block as f64 / (1024.0 * 1024.0)
    );
    println!(
        "   {} sequences decoding together: {:.1} tokens/s in all, {:.2}× one sequence's (goal ≥ 4: {})",
        engine::BATCH,
        r.batched_decode_tokens_per_s,
        r.batched_over_single,
        if r.batched_over_single >= 4.0 { "met" } else { "MISSED" }
    );
    out.insert("engine".into(), serde_json::to_value(&r)?);
    match llama_cpp_beside(&ids, &r) {
        Ok(l) => {
            out.insert("engine_llama_cpp".into(), serde_json::to_value(&l)?);
        }
        // llama-server is built once per machine by scripts/setup.sh; without it the
        // candle figures still stand on their own
        Err(e) => println!("   llama.cpp not measured: {e:#}"),
    }
    let c = engine::concurrency(
        &ids,
        &test_harness::cluster::run_dir("bench-engine-concurrency"),
    )?;
    println!(
        "   over HTTP, one pod (--max-num-seqs {n}), {}-token prompts, up to {} tokens each: one request {:.1} tokens/s, {n} at once {:.1} tokens/s in all, {:.2}× (goal ≥ 4: {})",
        c.prompt_tokens,
        c.max_tokens,
        c.alone_tokens_per_s,
        c.together_tokens_per_s,
        c.ratio,
        if c.ratio >= 4.0 { "met" } else { "MISSED" },
        n = engine::BATCH,
    );
    out.insert("engine_concurrency".into(), serde_json::to_value(&c)?);
    match engine::llama_cpp_concurrency(
        &ids,
        &test_harness::cluster::run_dir("bench-engine-concurrency-llama-cpp"),
    ) {
        Ok(l) => {
            println!(
                "   llama.cpp llama-server (--parallel {n}), the same requests: one request {:.1} tokens/s, {n} at once {:.1} tokens/s in all, {:.2}× (candle's ratio / llama.cpp's: {:.2})",
                l.alone_tokens_per_s,
                l.together_tokens_per_s,
                l.ratio,
                c.ratio / l.ratio,
                n = engine::BATCH,
            );
            out.insert(
                "engine_concurrency_llama_cpp".into(),
                serde_json::to_value(&l)?,
            );
        }
        Err(e) => println!("   llama.cpp concurrency not measured: {e:#}"),
    }
    Ok(out)
}
/// llama.cpp on the same prompts, printed as ratios beside the candle engine's figures.
fn llama_cpp_beside(
    ids: &[u32],
    r: &engine::EngineResult,
) -> anyhow::Result<crate::llama_cpp::LlamaCpp> {
    let prompts: Vec<&[u32]> = r.rows.iter().map(|row| &ids[..row.prompt_tokens]).collect();
    let six = r
        .rows
        .iter()
        .find(|x| x.cached_blocks == 6)
        .ok_or_else(|| anyhow::anyhow!("no 6-block row"))?;
    let l = crate::llama_cpp::run(
        &prompts,
        &ids[..engine::DECODE_AFTER],
        &ids[..six.prompt_tokens],
        &test_harness::cluster::run_dir("bench-engine-llama-cpp"),
    )?;
    let verdict = |ok: bool| if ok { "met" } else { "MISSED" };
    let (prefill, decode) = (
        r.prefill_tokens_per_s / l.prefill_tokens_per_s,
        r.decode_tokens_per_s / l.decode_tokens_per_s,
    );
    println!(
        "   llama.cpp llama-server (same GGUF, 2 threads, its own timings): prefill {:.0} tokens/s, decode {:.1} tokens/s, 6 cached blocks {:.0} ms vs {:.0} ms cold ({:.2})",
        l.prefill_tokens_per_s,
        l.decode_tokens_per_s,
        l.warm6_ms,
        l.cold6_ms,
        l.warm6_ms / l.cold6_ms
    );
    println!(
        "   candle / llama.cpp: prefill {prefill:.2}× (goal ≥ 1: {}), decode {decode:.2}× (goal ≥ 1: {})",
        verdict(prefill >= 1.0),
        verdict(decode >= 1.0)
    );
    Ok(l)
}
