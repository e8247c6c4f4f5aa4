//! The real engine: SmolLM2 (or any Llama-architecture GGUF) on CPU with candle, whose prefix
//! cache holds each 128-token block's attention K/V, so a hit genuinely skips that prefill.
//!
//! Requests run in one batching loop on its own thread (`engine::batcher`; `--max-num-seqs`
//! bounds how many at once): the cached blocks' K/V are concatenated, only the remaining
//! prompt tokens are computed (in chunks), the new full blocks are cut out and handed to the
//! cache, then tokens are sampled (greedy by default; `temperature`, `top_p`, `seed`) until
//! `max_tokens`, a stop string or end-of-sequence, every running request's next token
//! computed in one shared step.

use super::batcher::{Batcher, Model};
use super::llama::Llama;
use super::{Emitted, Engine, EngineError, FinishReason, GenerateRequest};
use candle_transformers::generation::{LogitsProcessor, Sampling};
use futures::future::BoxFuture;
use prefix_core::ModelBundle;
use std::sync::Arc;
use tokio::sync::mpsc;

pub struct CandleEngine {
    batcher: Batcher,
}

impl CandleEngine {
    pub fn load(path: &std::path::Path, bundle: Arc<ModelBundle>) -> anyhow::Result<Self> {
        let model = Llama::load(path)?;
        let t = bundle.tokenizer();
        let eos = ["<|im_end|>", "<|endoftext|>", "</s>", "<|eot_id|>"]
            .iter()
            .filter_map(|s| t.token_to_id(s))
            .collect();
        let batcher = Batcher::start(Model {
            llama: Arc::new(model),
            bundle,
            eos,
            sampler,
        })?;
        Ok(CandleEngine { batcher })
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
        let done = self.batcher.submit(req, out);
        Box::pin(async move {
            done.await
                .unwrap_or_else(|_| Err(failed("the engine thread stopped")))
        })
    }
}
