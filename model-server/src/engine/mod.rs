//! Inference engines behind one trait, so the HTTP layer, the scheduler and the prefix cache
//! are shared by the simulated engine and real ones.

pub mod candle_engine;
pub mod llama;
pub mod sim;

use crate::cache::Payload;
use futures::future::BoxFuture;
use std::sync::Arc;
use tokio::sync::mpsc;

/// What the engine is asked to do once the request holds a running slot and its cache lease.
#[derive(Debug, Clone)]
pub struct GenerateRequest {
    pub prompt_tokens: Arc<Vec<u32>>,
    /// Leading prompt tokens already in the prefix cache (their prefill is skipped).
    pub cached_tokens: usize,
    pub max_tokens: u32,
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    pub seed: Option<u64>,
    pub stop: Vec<String>,
    /// Payloads of the cached leading blocks, in order (engines with [`Engine::needs_kv`]).
    pub cached_kv: Vec<Payload>,
    pub block_size: usize,
}

/// What an engine sends while it works.
pub enum Emitted {
    /// After prefill: the payloads of the prompt's new full blocks (beyond the cached ones),
    /// in order, for the prefix cache.
    Blocks(Vec<Payload>),
    /// One generated token's text.
    Token(String),
}

/// Why generation ended, as OpenAI's `finish_reason`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishReason {
    Length,
    Stop,
}

impl FinishReason {
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Length => "length",
            FinishReason::Stop => "stop",
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error("client went away")]
    Cancelled,
    #[error("engine failure: {0}")]
    Failed(String),
}

/// An inference engine. `generate` sends each generated token's text on `out` as soon as it
/// exists and returns why it stopped. A closed `out` means the client left: stop early.
pub trait Engine: Send + Sync + 'static {
    fn name(&self) -> &'static str;
    /// Whether cached blocks are only usable with their payload (real K/V).
    fn needs_kv(&self) -> bool {
        false
    }
    fn generate(
        &self,
        req: GenerateRequest,
        out: mpsc::Sender<Emitted>,
    ) -> BoxFuture<'static, Result<FinishReason, EngineError>>;
}
