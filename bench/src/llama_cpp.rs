//! llama.cpp's `llama-server` on the same GGUF and cores, measured beside the candle engine
//! (issue 15's yardstick): its own timings of a cold prefill, a decode and a warm prompt.
//!
//! The figures are llama-server's `timings` (server-side, no HTTP), the counterpart of the
//! candle engine's in-process figures.

use serde::Serialize;
use test_harness::cluster::{client, start_pods_of, PodKind};

#[derive(Debug, Serialize)]
pub struct LlamaCpp {
    /// Prompt tokens per second over the same cold prompts as the candle rows.
    pub prefill_tokens_per_s: f64,
    /// Output tokens per second after a 256-token prompt.
    pub decode_tokens_per_s: f64,
    /// Prompt time of a prompt of 6 blocks + 16 tokens sent a second time, and cold.
    pub warm6_ms: f64,
    pub cold6_ms: f64,
}

/// llama-server's `timings` of one `/completion`.
struct Timings {
    prompt_n: f64,
    prompt_ms: f64,
    predicted_n: f64,
    predicted_ms: f64,
}

/// Starts one `llama-server` with both cores and measures it: `prompts` prefilled cold (no
/// prompt cache), [`crate::engine::DECODE_STEPS`] tokens decoded after `decode_prompt`, and
/// `warm_prompt` cold, then sent again with its prompt cached.
pub fn run(
    prompts: &[&[u32]],
    decode_prompt: &[u32],
    warm_prompt: &[u32],
    dir: &std::path::Path,
) -> anyhow::Result<LlamaCpp> {
    // both cores, as the candle engine has them
    let pods = start_pods_of(PodKind::LlamaCpp, 1, &["--threads", "2"], dir)?;
    let url = format!("http://{}/completion", pods[0].addr);
    let http = client();
    let send = |prompt: &[u32], n_predict: u32, cache: bool| -> anyhow::Result<Timings> {
        let body = serde_json::json!({
            "prompt": prompt,
            "n_predict": n_predict,
            "cache_prompt": cache,
            "ignore_eos": true,
            "temperature": 0.0,
        });
        let v = crate::post_json(&http, &url, &body)?;
        let t = &v["timings"];
        let f = |k: &str| {
            t[k].as_f64()
                .ok_or_else(|| anyhow::anyhow!("no timings.{k} in llama-server's answer {v}"))
        };
        Ok(Timings {
            prompt_n: f("prompt_n")?,
            prompt_ms: f("prompt_ms")?,
            predicted_n: f("predicted_n")?,
            predicted_ms: f("predicted_ms")?,
        })
    };
    send(decode_prompt, 4, false)?; // warm-up
    let (mut tokens, mut ms) = (0.0, 0.0);
    for p in prompts {
        let t = send(p, 1, false)?;
        tokens += t.prompt_n;
        ms += t.prompt_ms;
    }
    let d = send(decode_prompt, crate::engine::DECODE_STEPS as u32, false)?;
    let cold6 = send(warm_prompt, 1, false)?;
    send(warm_prompt, 1, true)?; // seeds the slot's cache
    let warm6 = send(warm_prompt, 1, true)?;
    Ok(LlamaCpp {
        prefill_tokens_per_s: tokens / (ms / 1e3),
        decode_tokens_per_s: d.predicted_n / (d.predicted_ms / 1e3),
        warm6_ms: warm6.prompt_ms,
        cold6_ms: cold6.prompt_ms,
    })
}
