//! An OpenAI-compatible model server with a block prefix cache.
//!
//! It is the "pod" that prefix-aware routing sends work to: it tokenizes and hashes prompts
//! exactly as the router does (`prefix-core`), keeps the blocks it computed in a bounded LRU
//! prefix cache, skips their prefill on a hit, and reports it all under vLLM's metric names.
//!
//! # Layout
//!
//! In request order:
//!
//! - [`config`]: command-line flags, validated once; [`state`]: what every handler shares,
//!   built from them.
//! - [`api`]: HTTP routes and handlers: body limit, parse (`prefix_core::request`), prepare
//!   (`prefix_core::ModelBundle`), errors as OpenAI JSON.
//! - [`pipeline`]: serving a prepared request: context check, [`admission`] (running slots
//!   and a bounded wait), [`cache`] lease, engine run, blocks stored, tokens relayed.
//! - [`openai`]: the response shapes, whole or streamed (SSE).
//! - [`cache`]: the block prefix cache (fixed-size blocks, LRU, pins) and its events
//!   history, which routers poll (`GET /v1/cache/events`; the page and its history are
//!   `prefix_core::protocol`'s).
//! - Engines, behind `gguf_engine::Engine`: [`sim`] (a latency model) and the real one, the
//!   `gguf-engine` crate (a Llama-family GGUF on CPU, K/V per block, requests batched
//!   continuously), which this crate reaches only through that trait.
//! - [`metrics`]: vLLM-named Prometheus metrics.

pub mod admission;
pub mod answer;
pub mod anthropic;
pub mod api;
pub mod cache;
pub mod config;
pub mod metrics;
pub mod openai;
pub mod pipeline;
pub mod responses_api;
pub mod sim;
pub mod state;

pub use config::Config;
pub use state::AppState;

use std::future::Future;
use tokio::net::TcpListener;

/// Serves `config` on `listener` until `shutdown` completes; in-flight requests then finish.
pub async fn run(
    config: Config,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let state = AppState::new(config)?;
    tracing::info!(
        pod = %state.pod,
        addr = %listener.local_addr()?,
        engine = state.engine.name(),
        model = state.bundle.name(),
        block_size = state.config.block_size,
        cache_blocks = state.config.cache_blocks(),
        "model server listening"
    );
    axum::serve(listener, api::router(state))
        .with_graceful_shutdown(shutdown)
        .await?;
    Ok(())
}

/// Resolves on SIGTERM or Ctrl-C.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = term => {},
    }
}
