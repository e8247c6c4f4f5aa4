//! The real engine: SmolLM2 (or any Llama-architecture GGUF) on CPU with candle, whose prefix
//! cache holds each 128-token block's attention K/V, so a hit genuinely skips that prefill.
//!
//! Each request runs on a blocking thread (off the async runtime; `--max-num-seqs` bounds how
//! many run at once): the cached blocks' K/V are concatenated, only the remaining prompt tokens
//! are computed, the new full blocks are cut out and handed to the cache, then tokens are
//! sampled (greedy by default; `temperature`, `top_p`, `seed`) until `max_tokens`, a stop
//! string or end-of-sequence.

use super::llama::{Kv, Llama};
use super::{Emitted, Engine, EngineError, FinishReason, GenerateRequest, KvBlock};
use candle_transformers::generation::{LogitsProcessor, Sampling};
use futures::future::BoxFuture;
use prefix_core::ModelBundle;
use std::sync::Arc;
use tokio::sync::mpsc;

pub struct CandleEngine {
    model: Arc<Llama>,
    bundle: Arc<ModelBundle>,
    eos: Vec<u32>,
}

impl CandleEngine {
    pub fn load(path: &std::path::Path, bundle: Arc<ModelBundle>) -> anyhow::Result<Self> {
        let model = Llama::load(path)?;
        let t = bundle.tokenizer();
        let eos = ["<|im_end|>", "<|endoftext|>", "</s>", "<|eot_id|>"]
            .iter()
            .filter_map(|s| t.token_to_id(s))
            .collect();
        Ok(CandleEngine {
            model: Arc::new(model),
            bundle,
            eos,
        })
    }
}

fn failed(e: impl std::fmt::Display) -> EngineError {
    EngineError::Failed(e.to_string())
}

fn sampler(req: &GenerateRequest) -> LogitsProcessor {
    let seed = req.seed.unwrap_or(299_792_458);
    let sampling = match (req.temperature, req.top_p) {
        (None, _) => Sampling::ArgMax,
        (Some(t), _) if t <= 0.0 => Sampling::ArgMax,
        (Some(t), Some(p)) if p < 1.0 => Sampling::TopP { p, temperature: t },
        (Some(t), _) => Sampling::All { temperature: t },
    };
    LogitsProcessor::from_sampling(seed, sampling)
}

/// The whole request, on a blocking thread.
fn run(
    model: &Llama,
    bundle: &ModelBundle,
    eos: &[u32],
    req: GenerateRequest,
    out: mpsc::Sender<Emitted>,
) -> Result<FinishReason, EngineError> {
    let bs = req.block_size;
    let cached: Vec<&Kv> = req.cached_kv.iter().map(|kv| &**kv).collect();
    let mut kv = match Kv::concat(&cached).map_err(failed)? {
        Some(kv) => kv,
        None => model.empty_kv().map_err(failed)?,
    };
    if kv.len() != req.cached_tokens {
        return Err(failed(format!(
            "cache gave {} positions for {} cached tokens",
            kv.len(),
            req.cached_tokens
        )));
    }
    let prompt = &req.prompt_tokens;
    let mut logits = model
        .forward(&prompt[kv.len()..], &mut kv)
        .map_err(failed)?;
    // cut the prompt's new full blocks out of the KV for the cache
    let full = prompt.len() / bs;
    let blocks: Vec<KvBlock> = (cached.len()..full)
        .map(|b| kv.slice(b * bs, bs).map(Arc::new))
        .collect::<Result<_, _>>()
        .map_err(failed)?;
    out.blocking_send(Emitted::Blocks(blocks))
        .map_err(|_| EngineError::Cancelled)?;

    let mut sampler = sampler(&req);
    let tokenizer = bundle.tokenizer();
    let mut generated: Vec<u32> = Vec::new();
    let mut text = String::new();
    for _ in 0..req.max_tokens {
        let next = sampler.sample(&logits).map_err(failed)?;
        if eos.contains(&next) {
            return Ok(FinishReason::Stop);
        }
        generated.push(next);
        let decoded = tokenizer.decode(&generated).map_err(failed)?;
        // hold back an incomplete UTF-8 character until the next token completes it
        let piece = if decoded.ends_with('\u{fffd}') {
            String::new()
        } else {
            decoded[text.len().min(decoded.len())..].to_owned()
        };
        text.push_str(&piece);
        let piece_len = piece.len();
        out.blocking_send(Emitted::Token(piece))
            .map_err(|_| EngineError::Cancelled)?;
        if req.stop.reached(&text, piece_len) {
            return Ok(FinishReason::Stop);
        }
        if kv.len() + 1 >= super::llama::MAX_POSITIONS {
            return Ok(FinishReason::Length);
        }
        logits = model.forward(&[next], &mut kv).map_err(failed)?;
    }
    Ok(FinishReason::Length)
}

impl Engine for CandleEngine {
    fn name(&self) -> &'static str {
        "candle"
    }

    fn needs_kv(&self) -> bool {
        true
    }

    fn generate(
        &self,
        req: GenerateRequest,
        out: mpsc::Sender<Emitted>,
    ) -> BoxFuture<'static, Result<FinishReason, EngineError>> {
        let model = Arc::clone(&self.model);
        let bundle = Arc::clone(&self.bundle);
        let eos = self.eos.clone();
        Box::pin(async move {
            tokio::task::spawn_blocking(move || run(&model, &bundle, &eos, req, out))
                .await
                .map_err(failed)?
        })
    }
}
