//! A CPU inference engine for Llama-family GGUF models (SmolLM2 by default) whose attention
//! K/V is kept per token block, so a server's prefix cache can hold real K/V and a cache hit
//! skips that part of the prefill.
//!
//! The model server uses it through [`Engine`] only ([`GgufEngine::load`] builds one); the
//! benchmark and the tests also reach the model ([`llama::Llama`]) and the kernel choice
//! ([`cpu`]) directly. The kernels are this crate's own loops over slices, chosen at run time
//! by the CPU's features; candle reads the GGUF and holds tensors.
//!
//! # Layout
//!
//! In request order:
//!
//! - [`Engine`], [`GenerateRequest`], [`Emitted`], [`FinishReason`]: what a server asks and
//!   hears back; [`stop`]: stop strings matched across token boundaries.
//! - [`gguf`]: [`GgufEngine`], the `Engine` over one model.
//! - [`batcher`]: the loop on its own thread that runs every active request together:
//!   prefill chunks, then one shared decode step per turn, sampling.
//! - [`llama`]: the forward passes; [`kv`]: the K/V a pass reads and grows, and a cache
//!   block holds.
//! - Prefill matrices: [`bf16`] (AVX-512 BF16, with AMX tiles in `bf16::amx`), else candle's
//!   f32 matmul.
//! - Decode step: [`decode`] over [`interleaved`] (AVX-512 VNNI) or [`blocks`] with the
//!   [`q4`]/[`q8`] matrices (AVX2 or portable); [`attention`] per head; [`exp`] for softmax
//!   and SiLU.
//! - [`cpu`]: which kernels run, from the CPU's features and `ENGINE_KERNELS`.
//! - [`tensor`]: a tensor's values as a slice; [`error`]: the one error type.
//! - [`vocab`]: a GGUF's own tokenizer written out as `tokenizer.json` (the
//!   `gguf-tokenizer` tool).

pub mod attention;
pub mod batcher;
pub mod bf16;
pub mod blocks;
pub mod cpu;
pub mod decode;
pub mod error;
pub mod exp;
pub mod gguf;
pub mod interleaved;
pub mod kv;
pub mod llama;
pub mod q4;
pub mod q8;
#[cfg(target_arch = "x86_64")]
mod simd;
pub mod stop;
pub mod tensor;
pub mod vocab;

pub use error::{Error, Result};
pub use gguf::GgufEngine;
pub use kv::Kv;
pub use stop::StopStrings;

use futures::future::BoxFuture;
use std::sync::Arc;
use tokio::sync::mpsc;

/// What a prefix cache keeps per block for engines that need it ([`Engine::needs_kv`]):
/// that block's attention K/V for every layer.
pub type KvBlock = Arc<Kv>;

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

/// Why a request's generation did not finish (the engine's own failures are [`Error`]s,
/// reported here as text).
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
    ) -> BoxFuture<'static, std::result::Result<FinishReason, EngineError>>;
}
