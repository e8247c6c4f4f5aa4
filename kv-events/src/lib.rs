//! kv-events: a sidecar that follows a vLLM pod's own KV-cache events (ZMQ, `--kv-events-config`)
//! and serves them as this project's cache-events page (`GET /v1/cache/events?since=SEQ`), so
//! the filter knows exactly which blocks each vLLM pod holds, evictions included, and every
//! Envoy replica learns the same thing from the same page.
//!
//! # Layout
//! In the order a message travels:
//! - [`wire`]: vLLM's messages (and SGLang's, the older array form), decoded and encoded.
//! - [`sequence`]: the live stream's numbers: in order, lost (replay), restarted.
//! - [`translate`]: the pod's blocks, named by its own hashes, turned into the router's chained
//!   hashes recomputed from their tokens.
//! - [`feed`]: one pod's followed state: the translator, the page history
//!   (`prefix_core::protocol::EventLog`), the pod's load and restarts from its `/metrics`.
//! - [`subscriber`]: the ZMQ side: SUB socket, replay requests, reconnects.
//! - [`serve`]: the HTTP side: the events page, `/health`, the sidecar's own `/metrics`.
//! - [`config`]: the command line, validated once.

pub mod config;
pub mod feed;
pub mod sequence;
pub mod serve;
pub mod subscriber;
pub mod translate;
pub mod wire;

pub use config::Config;

/// Runs the sidecar until the process is stopped.
pub async fn run(config: Config) -> anyhow::Result<()> {
    let feed = feed::SharedFeed::new(&config);
    let listener = tokio::net::TcpListener::bind(config.listen).await?;
    tracing::info!(
        listen = %listener.local_addr()?,
        events = %config.events,
        pod = %config.pod,
        "kv-events: serving the pod's cache-events page"
    );
    // the ready line tests and scripts wait for (the address is the bound one)
    println!("kv-events listening on {}", listener.local_addr()?);
    let subscriber = tokio::spawn(subscriber::follow(config.clone(), feed.clone()));
    let scraper = tokio::spawn(feed::scrape_pod(config.clone(), feed.clone()));
    let served = serve::serve(listener, feed).await;
    subscriber.abort();
    scraper.abort();
    served
}
