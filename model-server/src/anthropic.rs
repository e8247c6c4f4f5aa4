//! Answers in the shape of Anthropic-style messages (`POST /v1/messages`), as vLLM's
//! endpoint gives them: one `text` content block, `stop_reason` `end_turn` or `max_tokens`,
//! usage as `input_tokens`/`output_tokens` with the prompt tokens found in the prefix cache
//! as `cache_read_input_tokens`. Streamed: `message_start`, `content_block_start`, a
//! `content_block_delta` per piece, `content_block_stop`, `message_delta` with the stop
//! reason and usage, `message_stop`.

use crate::answer::{named_events, whole};
use crate::pipeline::{Chunk, Usage};
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures::StreamExt;
use gguf_engine::FinishReason;
use prefix_core::ApiError;
use serde_json::{json, Value};
use std::sync::atomic::{AtomicU64, Ordering};
use tokio::sync::mpsc;

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

fn stop_reason(f: FinishReason) -> &'static str {
    match f {
        FinishReason::Length => "max_tokens",
        FinishReason::Stop => "end_turn",
    }
}

fn usage(u: Usage) -> Value {
    json!({
        "input_tokens": u.prompt,
        "output_tokens": u.completion,
        "cache_read_input_tokens": u.cached,
    })
}

fn message(id: &str, model: &str, content: Value, stop: Option<&str>, u: Value) -> Value {
    json!({
        "id": id, "type": "message", "role": "assistant", "model": model,
        "content": content, "stop_reason": stop, "stop_sequence": null, "usage": u,
    })
}

fn next_id() -> String {
    format!("msg_{}", NEXT_ID.fetch_add(1, Ordering::Relaxed))
}

/// The whole message at once.
pub async fn collect(model: &str, rx: mpsc::Receiver<Chunk>) -> Result<Response, ApiError> {
    let w = whole(rx).await?;
    let content = json!([{"type": "text", "text": w.text}]);
    let m = message(
        &next_id(),
        model,
        content,
        Some(stop_reason(w.finish)),
        usage(w.usage),
    );
    Ok(Json(m).into_response())
}

/// The message as its event stream.
pub fn stream(model: &str, rx: mpsc::Receiver<Chunk>) -> Response {
    let start = message(
        &next_id(),
        model,
        json!([]),
        None,
        json!({"input_tokens": 0, "output_tokens": 0}),
    );
    let head = futures::stream::iter(vec![
        (
            "message_start",
            json!({"type": "message_start", "message": start}),
        ),
        (
            "content_block_start",
            json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
        ),
    ]);
    let body = tokio_stream::wrappers::ReceiverStream::new(rx).flat_map(|c| {
        let events = match c {
            Chunk::Text(t) => vec![(
                "content_block_delta",
                json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": t}}),
            )],
            Chunk::Done(finish, u) => vec![
                ("content_block_stop", json!({"type": "content_block_stop", "index": 0})),
                (
                    "message_delta",
                    json!({"type": "message_delta", "delta": {"stop_reason": stop_reason(finish), "stop_sequence": null}, "usage": usage(u)}),
                ),
                ("message_stop", json!({"type": "message_stop"})),
            ],
            Chunk::Failed(e) => vec![(
                "error",
                json!({"type": "error", "error": {"type": "api_error", "message": e}}),
            )],
        };
        futures::stream::iter(events)
    });
    named_events(head.chain(body))
}
