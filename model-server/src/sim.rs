//! The simulated engine: real scheduling and caching, modelled compute time.
//!
//! Latency model (in the spirit of llm-d-inference-sim):
//!
//! ```text
//! TTFT   = ttft_base + prefill_per_token × (prompt tokens − cached tokens)
//! decode = decode_per_token for every generated token after the first
//! ```
//!
//! So a prefix-cache hit visibly shortens time to first token, exactly the effect prefix-aware
//! routing is meant to buy. The default costs (100 ms + 3.5 ms per uncached token, 10 ms per
//! output token) follow the real engine on this project's 2-core machine (`scripts/bench.sh
//! engine`, 2026-12-05: cold 144 tokens 0.36 s … 1040 tokens 4.8–5.6 s; 16 uncached tokens
//! after cached blocks 0.11–0.23 s; decode ≈ 100 tokens/s, one sequence). Its prefill grows faster than linearly,
//! so the straight line overstates short prompts and understates ~1000-token ones. Tests and
//! benchmarks set their own. Output text is deterministic (derived from the prompt tokens) and
//! starts with `[simulated]` so nobody mistakes it for a model's answer.

use futures::future::BoxFuture;
use gguf_engine::{Emitted, Engine, EngineError, FinishReason, GenerateRequest};
use std::time::Duration;
use tokio::sync::mpsc;
use xxhash_rust::xxh3::xxh3_64;

/// Cost parameters of the latency model.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SimCosts {
    pub ttft_base: Duration,
    pub prefill_per_token: Duration,
    pub decode_per_token: Duration,
}

impl SimCosts {
    /// All zero: the engine returns as fast as the server can serve.
    pub const ZERO: SimCosts = SimCosts {
        ttft_base: Duration::ZERO,
        prefill_per_token: Duration::ZERO,
        decode_per_token: Duration::ZERO,
    };

    /// Modelled prefill time for `uncached` prompt tokens.
    pub fn ttft(&self, uncached: usize) -> Duration {
        self.ttft_base
            + self
                .prefill_per_token
                .saturating_mul(uncached.min(u32::MAX as usize) as u32)
    }
}

pub struct SimEngine {
    costs: SimCosts,
}

impl SimEngine {
    pub fn new(costs: SimCosts) -> Self {
        SimEngine { costs }
    }
}

const WORDS: &[&str] = &[
    "check", "the", "service", "logs", "restart", "node", "cache", "latency", "pod", "alert",
    "runbook", "metrics", "verify", "rollback", "deploy", "queue", "disk", "memory", "network",
    "config", "health", "route", "prefix", "block",
];

async fn pause(d: Duration) {
    if !d.is_zero() {
        tokio::time::sleep(d).await;
    }
}

impl Engine for SimEngine {
    fn name(&self) -> &'static str {
        "sim"
    }

    fn generate(
        &self,
        req: GenerateRequest,
        out: mpsc::Sender<Emitted>,
    ) -> BoxFuture<'static, Result<FinishReason, EngineError>> {
        let costs = self.costs;
        Box::pin(async move {
            let uncached = req.prompt_tokens.len().saturating_sub(req.cached_tokens);
            pause(costs.ttft(uncached)).await;
            let bytes: Vec<u8> = req
                .prompt_tokens
                .iter()
                .flat_map(|t| t.to_le_bytes())
                .collect();
            let mut state = xxh3_64(&bytes) ^ req.seed.unwrap_or(0);
            let mut text = String::new();
            for i in 0..req.max_tokens {
                if i > 0 {
                    pause(costs.decode_per_token).await;
                }
                let piece = if i == 0 {
                    "[simulated]".to_owned()
                } else {
                    state = xxh3_64(&state.to_le_bytes());
                    format!(" {}", WORDS[(state % WORDS.len() as u64) as usize])
                };
                text.push_str(&piece);
                let piece_len = piece.len();
                out.send(Emitted::Token(piece))
                    .await
                    .map_err(|_| EngineError::Cancelled)?;
                if req.stop.reached(&text, piece_len) {
                    return Ok(FinishReason::Stop);
                }
            }
            Ok(FinishReason::Length)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn ttft_model() {
        let c = SimCosts {
            ttft_base: Duration::from_millis(2),
            prefill_per_token: Duration::from_micros(100),
            decode_per_token: Duration::ZERO,
        };
        assert_eq!(c.ttft(0), Duration::from_millis(2));
        assert_eq!(c.ttft(300), Duration::from_millis(32));
    }

    #[tokio::test]
    async fn deterministic_marked_output() {
        let e = SimEngine::new(SimCosts::ZERO);
        let run = || async {
            let (tx, mut rx) = mpsc::channel(64);
            let req = GenerateRequest {
                prompt_tokens: Arc::new(vec![1, 2, 3]),
                cached_tokens: 0,
                max_tokens: 5,
                temperature: None,
                top_p: None,
                seed: None,
                stop: Default::default(),
                cached_kv: vec![],
                block_size: 128,
            };
            let reason = e.generate(req, tx).await.unwrap();
            let mut s = String::new();
            while let Some(p) = rx.recv().await {
                if let Emitted::Token(t) = p {
                    s.push_str(&t);
                }
            }
            (reason, s)
        };
        let (r1, a) = run().await;
        let (_, b) = run().await;
        assert_eq!(r1, FinishReason::Length);
        assert_eq!(a, b);
        assert!(a.starts_with("[simulated]"));
        assert_eq!(a.split(' ').count(), 5);
    }
}
