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
use futures::future::BoxFuture;
use prefix_core::ModelBundle;
use std::sync::Arc;
use tokio::sync::mpsc;

pub struct CandleEngine {
    batcher: Batcher,
}

impl CandleEngine {
    /// Loads the GGUF at `path`; the batching loop observes its tokens per turn in
    /// `step_tokens`.
    pub fn load(
        path: &std::path::Path,
        bundle: Arc<ModelBundle>,
        step_tokens: prometheus::Histogram,
    ) -> anyhow::Result<Self> {
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
            step_tokens,
        })?;
        Ok(CandleEngine { batcher })
    }
}

impl Engine for CandleEngine {
    fn name(&self) -> &'static str {
        "gguf"
    }

    fn needs_kv(&self) -> bool {
        true
    }

    fn generate(
        &self,
        req: GenerateRequest,
        out: mpsc::Sender<Emitted>,
    ) -> BoxFuture<'static, Result<FinishReason, EngineError>> {
        Box::pin(self.batcher.submit(req, out))
    }
}
