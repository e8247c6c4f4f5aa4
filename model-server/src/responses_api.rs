//! Answers in the shape of OpenAI's Responses API (`POST /v1/responses`): one `message`
//! output item with one `output_text` part, usage as `input_tokens`/`output_tokens` (cached
//! prompt tokens in `input_tokens_details`), an answer cut by `max_output_tokens` marked
//! `incomplete`. Streamed, it is the API's event sequence: `response.created`, the item and
//! its part added, `response.output_text.delta` per piece, then each closed and
//! `response.completed` with the whole response. Nothing is stored, so a request naming a
//! `previous_response_id` is answered 404 as vLLM answers it without its store.

use crate::answer::{named_events, whole, Whole};
use crate::openai::unix_now;
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

/// A continued response: vLLM without its store does not know the id either.
pub fn not_stored(id: &str) -> ApiError {
    ApiError::not_found(
        format!("Response with id '{id}' not found."),
        Some("response_id"),
    )
}

struct Ids {
    response: String,
    message: String,
    created: u64,
    model: String,
}

impl Ids {
    fn new(model: &str) -> Self {
        let n = NEXT_ID.fetch_add(1, Ordering::Relaxed);
        Ids {
            response: format!("resp_{n}"),
            message: format!("msg_{n}"),
            created: unix_now(),
            model: model.to_owned(),
        }
    }

    fn item(&self, text: &str, done: bool) -> Value {
        let status = if done { "completed" } else { "in_progress" };
        let content = match done {
            true => json!([{"type": "output_text", "text": text, "annotations": []}]),
            false => json!([]),
        };
        json!({"type": "message", "id": self.message, "status": status, "role": "assistant", "content": content})
    }

    /// The response object; `end` once generation is over.
    fn response(&self, end: Option<&Whole>) -> Value {
        let (status, output, usage, incomplete) = match end {
            None => ("in_progress", json!([]), Value::Null, Value::Null),
            Some(w) => {
                let cut = matches!(w.finish, FinishReason::Length);
                (
                    if cut { "incomplete" } else { "completed" },
                    json!([self.item(&w.text, true)]),
                    usage(w.usage),
                    if cut {
                        json!({"reason": "max_output_tokens"})
                    } else {
                        Value::Null
                    },
                )
            }
        };
        json!({
            "id": self.response, "object": "response", "created_at": self.created,
            "status": status, "model": self.model, "output": output,
            "incomplete_details": incomplete, "usage": usage,
            "parallel_tool_calls": true, "tool_choice": "auto", "tools": [],
        })
    }
}

fn usage(u: Usage) -> Value {
    json!({
        "input_tokens": u.prompt,
        "input_tokens_details": {"cached_tokens": u.cached},
        "output_tokens": u.completion,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": u.prompt + u.completion,
    })
}

/// The whole response at once.
pub async fn collect(model: &str, rx: mpsc::Receiver<Chunk>) -> Result<Response, ApiError> {
    let w = whole(rx).await?;
    Ok(Json(Ids::new(model).response(Some(&w))).into_response())
}

/// The response as the API's event stream.
pub fn stream(model: &str, rx: mpsc::Receiver<Chunk>) -> Response {
    let ids = std::sync::Arc::new(Ids::new(model));
    let head = {
        let ids = ids.clone();
        futures::stream::iter(vec![
            ("response.created", json!({"response": ids.response(None)})),
            (
                "response.in_progress",
                json!({"response": ids.response(None)}),
            ),
            (
                "response.output_item.added",
                json!({"output_index": 0, "item": ids.item("", false)}),
            ),
            (
                "response.content_part.added",
                json!({"item_id": ids.message, "output_index": 0, "content_index": 0,
                       "part": {"type": "output_text", "text": "", "annotations": []}}),
            ),
        ])
    };
    let mut text = String::new();
    let body = tokio_stream::wrappers::ReceiverStream::new(rx).flat_map(move |c| {
        let events = match c {
            Chunk::Text(t) => {
                text.push_str(&t);
                vec![(
                    "response.output_text.delta",
                    json!({"item_id": ids.message, "output_index": 0, "content_index": 0, "delta": t, "logprobs": []}),
                )]
            }
            Chunk::Done(finish, usage) => {
                let w = Whole { text: std::mem::take(&mut text), finish, usage };
                let part = json!({"type": "output_text", "text": w.text, "annotations": []});
                vec![
                    (
                        "response.output_text.done",
                        json!({"item_id": ids.message, "output_index": 0, "content_index": 0, "text": w.text, "logprobs": []}),
                    ),
                    (
                        "response.content_part.done",
                        json!({"item_id": ids.message, "output_index": 0, "content_index": 0, "part": part}),
                    ),
                    ("response.output_item.done", json!({"output_index": 0, "item": ids.item(&w.text, true)})),
                    ("response.completed", json!({"response": ids.response(Some(&w))})),
                ]
            }
            Chunk::Failed(e) => vec![(
                "error",
                json!({"code": "server_error", "message": e, "param": null}),
            )],
        };
        futures::stream::iter(events)
    });
    // every event carries its type and a sequence number, as the API's do
    let numbered = head.chain(body).enumerate().map(|(n, (name, mut data))| {
        data["type"] = json!(name);
        data["sequence_number"] = json!(n);
        (name, data)
    });
    named_events(numbered)
}
