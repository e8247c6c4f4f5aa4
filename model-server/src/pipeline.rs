//! The serving pipeline: a parsed request and its prepared prompt in, a stream of [`Chunk`]s
//! out. Lengths checked ([`check_lengths`], by [`crate::api`] for every prompt of a request
//! before any runs) → admission (a running slot, or a bounded wait) → prefix-cache lease
//! (hits pinned, their prefill skipped) → engine on its own task → the prompt's new blocks
//! stored once prefill is done → tokens relayed → usage and metrics at the end.
//!
//! HTTP and OpenAI response shapes are not here ([`crate::api`], [`crate::openai`]): this is
//! what a request costs the pod, whatever shape it is answered in.

use crate::cache::Lease;
use crate::config::Config;
use crate::state::AppState;
use gguf_engine::{Emitted, EngineError, FinishReason, GenerateRequest, KvBlock, StopStrings};
use prefix_core::request::InferenceRequest;
use prefix_core::{ApiError, BlockHash, PreparedPrompt};
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::mpsc;

/// What the pipeline sends while a request is served.
pub enum Chunk {
    /// Generated text (one token's worth).
    Text(String),
    /// Generation ended normally.
    Done(FinishReason, Usage),
    /// The engine failed (after the response may have started).
    Failed(String),
}

/// Token counts of one request, as OpenAI's `usage`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    pub prompt: usize,
    pub completion: usize,
    /// Prompt tokens served from the prefix cache.
    pub cached: usize,
}

/// Decrements a gauge when the request stops running, however it ends.
struct RunningGuard(prometheus::IntGauge);

impl Drop for RunningGuard {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// Starts serving `req` (whose prompt is `prompt`, already checked by [`check_lengths`]:
/// every prompt of a batch is, before any of them runs). `Err` before anything was computed
/// is the client's answer (429 queue full); afterwards everything arrives as chunks.
pub async fn serve(
    s: &Arc<AppState>,
    req: &InferenceRequest,
    prompt: PreparedPrompt,
    started: Instant,
) -> Result<mpsc::Receiver<Chunk>, ApiError> {
    let n_prompt = prompt.tokens.len();

    let metrics = &s.metrics;
    let slot = s
        .admission
        .enter(|w| metrics.waiting.set(w as i64))
        .await
        .map_err(|_| ApiError::overloaded("the server's request queue is full; retry later"))?;
    metrics.running.inc();
    let running = RunningGuard(metrics.running.clone());
    let admitted = Instant::now();
    metrics
        .queue_time
        .observe(admitted.duration_since(started).as_secs_f64());

    let mut lease = s.cache.acquire(&prompt.hashes, n_prompt);
    let cached = lease.hit_blocks() * s.cache.block_size();
    metrics.prefix_cache_queries.inc_by(n_prompt as u64);
    metrics.prefix_cache_hits.inc_by(cached as u64);
    metrics.prompt_tokens.inc_by(n_prompt as u64);

    let gen = GenerateRequest {
        prompt_tokens: Arc::new(prompt.tokens),
        cached_tokens: cached,
        max_tokens: max_new_tokens(&s.config, req, n_prompt),
        temperature: req.temperature,
        top_p: req.top_p,
        seed: req.seed,
        stop: StopStrings::new(req.stop.clone()),
        cached_kv: lease.hit_payloads().to_vec(),
        block_size: s.cache.block_size(),
    };
    let hashes = prompt.hashes;
    let (out_tx, out_rx) = mpsc::channel::<Chunk>(64);
    let state = Arc::clone(s);
    tokio::spawn(async move {
        let _slot = slot;
        let _running = running;
        let (tok_tx, tok_rx) = mpsc::channel::<Emitted>(64);
        let engine_fut = state.engine.generate(gen, tok_tx);
        let relay = relay(
            &state,
            &mut lease,
            &hashes,
            tok_rx,
            &out_tx,
            (started, admitted),
        );
        let (result, completion) = tokio::join!(engine_fut, relay);
        state.metrics.generation_tokens.inc_by(completion as u64);
        state.metrics.e2e.observe(started.elapsed().as_secs_f64());
        state
            .metrics
            .inference_time
            .observe(admitted.elapsed().as_secs_f64());
        let usage = Usage {
            prompt: n_prompt,
            completion,
            cached,
        };
        let last = match result {
            Ok(reason) => Chunk::Done(reason, usage),
            Err(EngineError::Cancelled) => return,
            Err(e) => Chunk::Failed(e.to_string()),
        };
        let _ = out_tx.send(last).await;
    });
    Ok(out_rx)
}

/// Relays the engine's tokens to the client as chunks. Prefill is done once the first token
/// (or the engine's blocks and then the end) exists: the prompt's new blocks are stored in the
/// cache then, and time to first token and prefill time observed. Stops when the client goes
/// (dropping the receiver stops the engine); the tokens relayed.
async fn relay(
    state: &AppState,
    lease: &mut Lease<KvBlock>,
    hashes: &[BlockHash],
    mut tok_rx: mpsc::Receiver<Emitted>,
    out_tx: &mpsc::Sender<Chunk>,
    (started, admitted): (Instant, Instant),
) -> usize {
    let mut completion = 0usize;
    let mut blocks: Vec<KvBlock> = Vec::new();
    let mut stored = false;
    let mut store = |blocks: Vec<KvBlock>| {
        let out = lease.store_with(hashes, blocks);
        state.metrics.blocks_stored.inc_by(out.stored as u64);
        state.metrics.blocks_evicted.inc_by(out.evicted as u64);
        state.metrics.kv_cache_usage.set(state.cache.usage());
    };
    while let Some(emitted) = tok_rx.recv().await {
        let piece = match emitted {
            Emitted::Blocks(b) => {
                blocks = b;
                continue;
            }
            Emitted::Token(t) => t,
        };
        if !stored {
            stored = true;
            store(std::mem::take(&mut blocks));
            state.metrics.ttft.observe(started.elapsed().as_secs_f64());
            state
                .metrics
                .prefill_time
                .observe(admitted.elapsed().as_secs_f64());
        }
        completion += 1;
        if out_tx.send(Chunk::Text(piece)).await.is_err() {
            break; // client gone
        }
    }
    if !stored && !blocks.is_empty() {
        store(blocks); // ended before any token (e.g. end-of-sequence first)
    }
    completion
}

/// The prompt must fit the model and hold at least one token, and the tokens asked for must
/// fit beside it (vLLM's rule: `prompt + max_tokens <= max_model_len`), so no request
/// generates without end.
pub(crate) fn check_lengths(
    config: &Config,
    req: &InferenceRequest,
    n_prompt: usize,
) -> Result<(), ApiError> {
    let max = config.max_model_len;
    if n_prompt > max {
        return Err(ApiError::context_length(max, n_prompt, false, req.endpoint));
    }
    if n_prompt == 0 {
        return Err(ApiError::invalid(
            "the prompt tokenizes to nothing",
            Some("prompt"),
        ));
    }
    if let Some(asked) = req.max_tokens.map(|m| m as usize) {
        if n_prompt + asked > max {
            return Err(ApiError::invalid(
                format!(
                    "'max_tokens' is too large: {asked}. This model's maximum context length is {max} tokens and your request has {n_prompt} input tokens ({asked} > {max} - {n_prompt})."
                ),
                Some("max_tokens"),
            )
            .with_code("context_length_exceeded"));
        }
    }
    Ok(())
}

/// Tokens to generate: what the request asks (checked to fit), or the server's default
/// within what is left of the context.
fn max_new_tokens(config: &Config, req: &InferenceRequest, n_prompt: usize) -> u32 {
    req.max_tokens.unwrap_or_else(|| {
        let left = config.max_model_len.saturating_sub(n_prompt);
        config
            .default_max_tokens
            .min(u32::try_from(left).unwrap_or(u32::MAX))
            .max(1)
    })
}
