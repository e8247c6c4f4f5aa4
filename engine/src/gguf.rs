//! The engine over one GGUF model: SmolLM2 (or any Llama-architecture GGUF) on CPU, whose
//! prefix cache holds each block's attention K/V, so a hit genuinely skips that prefill.
//!
//! Requests run in one batching loop on its own thread ([`crate::batcher`]; its caller bounds
//! how many at once): the cached blocks' K/V are concatenated, only the remaining prompt
//! tokens are computed (in chunks), the new full blocks are cut out and handed to the cache,
//! then tokens are sampled (greedy by default; `temperature`, `top_p`, `seed`) until
//! `max_tokens`, a stop string or end-of-sequence, every running request's next token
//! computed in one shared step.

use crate::batcher::{Batcher, Model};
use crate::llama::Llama;
use crate::{Emitted, Engine, EngineError, Error, FinishReason, GenerateRequest, Result};
use futures::future::BoxFuture;
use prefix_core::ModelBundle;
use std::sync::Arc;
use tokio::sync::mpsc;

/// Tokens that end a generation in the chat formats this engine meets.
const END_TOKENS: [&str; 4] = ["<|im_end|>", "<|endoftext|>", "</s>", "<|eot_id|>"];

pub struct GgufEngine {
    batcher: Batcher,
}

impl GgufEngine {
    /// Loads the GGUF at `path` and starts its batching loop, which tells `on_step` the
    /// tokens it computed in each turn.
    pub fn load(
        path: &std::path::Path,
        bundle: Arc<ModelBundle>,
        on_step: impl Fn(usize) + Send + Sync + 'static,
    ) -> Result<Self> {
        let model = Llama::load(path)?;
        tracing::info!(model = %path.display(), kernels = %crate::cpu::level(), "engine loaded");
        let t = bundle.tokenizer();
        let eos = END_TOKENS.iter().filter_map(|s| t.token_to_id(s)).collect();
        let batcher = Batcher::start(Model {
            llama: Arc::new(model),
            bundle,
            eos,
            on_step: Box::new(on_step),
        })
        .map_err(Error::Thread)?;
        Ok(GgufEngine { batcher })
    }
}

impl Engine for GgufEngine {
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
    ) -> BoxFuture<'static, std::result::Result<FinishReason, EngineError>> {
        Box::pin(self.batcher.submit(req, out))
    }
}
