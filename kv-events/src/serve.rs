//! The HTTP side, on `--listen` (127.0.0.1 by default; the filter's poller is its only
//! reader):
//! - `GET /v1/cache/events?since=SEQ`: the page, as this project's server serves it; 503 with
//!   an OpenAI-style JSON error while the pod's `/metrics` does not answer, its events are not
//!   subscribed to, or its blocks cannot be matched (the filter then counts failed polls and marks the pod down);
//! - `GET /health`: 200 when the page is served, else 503;
//! - `GET /metrics`: the sidecar's own counters (`kv_events_*`).

use crate::feed::SharedFeed;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use prefix_core::protocol::EVENTS_PATH;
use prefix_core::ApiError;
use prometheus::{Encoder, IntGauge, Registry, TextEncoder};
use serde::Deserialize;

#[derive(Deserialize)]
struct Since {
    #[serde(default)]
    since: u64,
}

pub fn router(feed: SharedFeed) -> Router {
    Router::new()
        .route(EVENTS_PATH, get(page))
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .with_state(feed)
}

pub async fn serve(listener: tokio::net::TcpListener, feed: SharedFeed) -> anyhow::Result<()> {
    axum::serve(listener, router(feed)).await?;
    Ok(())
}

fn unavailable(why: String) -> Response {
    let body = ApiError::internal(why).to_json();
    (
        StatusCode::SERVICE_UNAVAILABLE,
        [("content-type", "application/json")],
        body,
    )
        .into_response()
}

async fn page(State(feed): State<SharedFeed>, Query(q): Query<Since>) -> Response {
    match feed.lock().page(q.since) {
        Ok(page) => Json(page).into_response(),
        Err(why) => unavailable(why),
    }
}

async fn health(State(feed): State<SharedFeed>) -> Response {
    match feed.lock().healthy() {
        Ok(_) => "ok".into_response(),
        Err(why) => unavailable(why),
    }
}

async fn metrics(State(feed): State<SharedFeed>) -> Response {
    let (counters, skipped, held) = {
        let f = feed.lock();
        (f.counters, f.skipped(), f.held_blocks())
    };
    let registry = Registry::new();
    let values = [
        ("kv_events_messages", "Event messages received live.", counters.messages),
        ("kv_events_undecodable", "Messages that could not be decoded (skipped).", counters.undecodable),
        ("kv_events_gaps", "Times messages were found lost.", counters.gaps),
        ("kv_events_replayed", "Gaps closed by the pod's replay socket.", counters.replayed),
        ("kv_events_resets", "Gaps that could not be closed: the pod's blocks were forgotten.", counters.resets),
        ("kv_events_pod_restarts", "Pod restarts seen (numbers starting again, or a new start time).", counters.pod_restarts),
        ("kv_events_refused", "Events refused (block sizes the router cannot match).", counters.refused),
        ("kv_events_skipped_other_medium", "Stored blocks of offload tiers or other KV groups (not followed).", skipped.other_medium),
        ("kv_events_skipped_unknown_parent", "Stored blocks whose chain began before this process listened (not followed).", skipped.unknown_parent),
        ("kv_events_skipped_opaque", "Stored blocks not named by tokens alone: multimodal, embeddings, numbered adapters (not followed).", skipped.opaque_keys),
        ("kv_events_unknown_events", "Events of types this version does not know (skipped).", skipped.unknown_events),
        ("kv_events_over_limit_resets", "Times more blocks than --max-blocks were followed and all were forgotten.", skipped.over_limit_resets),
        ("kv_events_held_blocks", "Router blocks the pod holds now.", held as u64),
    ];
    for (name, help, value) in values {
        if let Ok(g) = IntGauge::new(name, help) {
            g.set(i64::try_from(value).unwrap_or(i64::MAX));
            let _ = registry.register(Box::new(g));
        }
    }
    let mut out = Vec::new();
    match TextEncoder::new().encode(&registry.gather(), &mut out) {
        Ok(()) => ([("content-type", "text/plain; version=0.0.4")], out).into_response(),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
    }
}
