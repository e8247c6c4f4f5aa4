//! OpenAI response shapes: a whole completion or chat completion, or their SSE stream of
//! chunks. The four choice shapes (completion / chat × whole / chunk) are written once, in
//! `Reply::choice`.

use crate::engine::FinishReason;
use crate::pipeline::{Chunk, Usage};
use axum::http::{header, HeaderValue};
use axum::response::sse::{Event, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures::StreamExt;
use prefix_core::request::Endpoint;
use prefix_core::ApiError;
use serde_json::{json, Value};
use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

pub fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

impl Usage {
    fn json(self) -> Value {
        json!({
            "prompt_tokens": self.prompt,
            "completion_tokens": self.completion,
            "total_tokens": self.prompt + self.completion,
            "prompt_tokens_details": {"cached_tokens": self.cached},
        })
    }
}

/// What every part of one answer shares: its id, kind, time and model.
pub struct Reply {
    endpoint: Endpoint,
    id: String,
    created: u64,
    model: String,
}

impl Reply {
    pub fn new(endpoint: Endpoint, model: &str) -> Self {
        let n = NEXT_ID.fetch_add(1, Ordering::Relaxed);
        let id = match endpoint {
            Endpoint::Completions => format!("cmpl-{n}"),
            Endpoint::ChatCompletions => format!("chatcmpl-{n}"),
        };
        Reply {
            endpoint,
            id,
            created: unix_now(),
            model: model.to_owned(),
        }
    }

    fn object(&self, streamed: bool) -> &'static str {
        match (self.endpoint, streamed) {
            (Endpoint::Completions, _) => "text_completion",
            (Endpoint::ChatCompletions, false) => "chat.completion",
            (Endpoint::ChatCompletions, true) => "chat.completion.chunk",
        }
    }

    /// One choice: `text` (a whole answer, or a chunk's piece), `finish` when it ends here,
    /// `first` for a stream's first chunk (chat announces the role in it).
    fn choice(
        &self,
        text: &str,
        finish: Option<FinishReason>,
        streamed: bool,
        first: bool,
    ) -> Value {
        let finish = finish.map(FinishReason::as_str);
        match (self.endpoint, streamed) {
            (Endpoint::Completions, _) => {
                json!({"index": 0, "text": text, "logprobs": null, "finish_reason": finish})
            }
            (Endpoint::ChatCompletions, false) => json!({
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "logprobs": null,
                "finish_reason": finish,
            }),
            (Endpoint::ChatCompletions, true) => {
                let delta = match (first, finish.is_some()) {
                    (_, true) => json!({}),
                    (true, false) => json!({"role": "assistant", "content": text}),
                    (false, false) => json!({"content": text}),
                };
                json!({"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish})
            }
        }
    }

    fn body(&self, choice: Value, streamed: bool, usage: Option<Usage>) -> Value {
        let mut v = json!({
            "id": self.id, "object": self.object(streamed), "created": self.created,
            "model": self.model, "choices": [choice],
        });
        if let Some(u) = usage {
            v["usage"] = u.json();
        }
        v
    }
}

/// The whole answer at once.
pub async fn collect(reply: Reply, mut rx: mpsc::Receiver<Chunk>) -> Result<Response, ApiError> {
    let mut text = String::new();
    while let Some(c) = rx.recv().await {
        match c {
            Chunk::Text(t) => text.push_str(&t),
            Chunk::Failed(e) => return Err(ApiError::internal(e)),
            Chunk::Done(reason, usage) => {
                let choice = reply.choice(&text, Some(reason), false, false);
                return Ok(Json(reply.body(choice, false, Some(usage))).into_response());
            }
        }
    }
    Err(ApiError::internal("generation ended without a result"))
}

/// The answer as server-sent events, ending with `[DONE]`; usage rides on the last chunk.
pub fn stream(reply: Reply, rx: mpsc::Receiver<Chunk>) -> Response {
    let mut first = true;
    let events = ReceiverStream::new(rx).map(move |c| {
        let data = match c {
            Chunk::Text(t) => {
                let choice = reply.choice(&t, None, true, first);
                first = false;
                reply.body(choice, true, None).to_string()
            }
            Chunk::Done(reason, usage) => {
                let choice = reply.choice("", Some(reason), true, first);
                reply.body(choice, true, Some(usage)).to_string()
            }
            Chunk::Failed(e) => ApiError::internal(e).to_json(),
        };
        Ok::<_, Infallible>(Event::default().data(data))
    });
    let done =
        futures::stream::once(async { Ok::<_, Infallible>(Event::default().data("[DONE]")) });
    let mut res = Sse::new(events.chain(done)).into_response();
    res.headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    res
}
