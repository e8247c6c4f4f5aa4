//! What the answer shapes share: one prompt's chunks read to the end, and a stream of named
//! server-sent events (the Responses and Anthropic-style streams name each event).

use crate::pipeline::{Chunk, Usage};
use axum::http::{header, HeaderValue};
use axum::response::sse::{Event, Sse};
use axum::response::{IntoResponse, Response};
use gguf_engine::FinishReason;
use prefix_core::ApiError;
use serde_json::Value;
use std::convert::Infallible;
use tokio::sync::mpsc;

/// A whole answer: its text, why it ended, and its token counts.
pub struct Whole {
    pub text: String,
    pub finish: FinishReason,
    pub usage: Usage,
}

/// Reads one prompt's chunks to the end.
pub async fn whole(mut rx: mpsc::Receiver<Chunk>) -> Result<Whole, ApiError> {
    let mut text = String::new();
    while let Some(c) = rx.recv().await {
        match c {
            Chunk::Text(t) => text.push_str(&t),
            Chunk::Failed(e) => return Err(ApiError::internal(e)),
            Chunk::Done(finish, usage) => {
                return Ok(Whole {
                    text,
                    finish,
                    usage,
                })
            }
        }
    }
    Err(ApiError::internal("generation ended without a result"))
}

/// Named events as server-sent events (`event: <name>` then `data: <json>`).
pub fn named_events(
    events: impl futures::Stream<Item = (&'static str, Value)> + Send + 'static,
) -> Response {
    use futures::StreamExt;
    let events = events.map(|(name, data)| {
        Ok::<_, Infallible>(Event::default().event(name).data(data.to_string()))
    });
    let mut res = Sse::new(events).into_response();
    res.headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    res
}
