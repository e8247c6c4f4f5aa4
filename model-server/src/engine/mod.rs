//! Inference engines behind one trait, so the HTTP layer, the scheduler and the prefix cache
//! are shared by the simulated engine and real ones.

#[cfg(target_arch = "x86_64")]
pub mod amx;
pub mod attention;
pub mod batcher;
pub mod bf16;
pub mod blocks;
pub mod candle_engine;
pub mod cpu;
pub mod decode;
pub mod exp;
pub mod interleaved;
pub mod llama;
pub mod q4;
pub mod q8;
pub mod sim;
#[cfg(target_arch = "x86_64")]
mod simd;
pub mod stop;

use crate::cache::BlockPrefixCache;
use futures::future::BoxFuture;
use std::sync::Arc;
pub use stop::StopStrings;
use tokio::sync::mpsc;

/// What the prefix cache keeps per block for engines that need it ([`Engine::needs_kv`]):
/// that block's attention K/V for every layer.
pub type KvBlock = Arc<llama::Kv>;

/// The server's prefix cache.
pub type Cache = BlockPrefixCache<KvBlock>;

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
    pub stop: StopStrings,
    /// Payloads of the cached leading blocks, in order (engines with [`Engine::needs_kv`]).
    pub cached_kv: Vec<KvBlock>,
    pub block_size: usize,
}

/// What an engine sends while it works.
pub enum Emitted {
    /// After prefill: the payloads of the prompt's new full blocks (beyond the cached ones),
    /// in order, for the prefix cache.
    Blocks(Vec<KvBlock>),
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
    /// Whether cached blocks are only usable with their K/V (the cache is then built to
    /// count only such blocks as hits).
    fn needs_kv(&self) -> bool {
        false
    }
    fn generate(
        &self,
        req: GenerateRequest,
        out: mpsc::Sender<Emitted>,
    ) -> BoxFuture<'static, Result<FinishReason, EngineError>>;
}
