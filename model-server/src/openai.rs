//! OpenAI response shapes: a whole completion or chat completion, or their SSE stream of
//! chunks. The four choice shapes (completion / chat × whole / chunk) are written once, in
//! `Reply::choice`.

use crate::pipeline::{Chunk, Usage};
use axum::http::{header, HeaderValue};
use axum::response::sse::{Event, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures::StreamExt;
use gguf_engine::FinishReason;
use prefix_core::request::Endpoint;
use prefix_core::ApiError;
use serde_json::{json, Value};
use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};
use tokio::sync::mpsc;

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
            _ => format!("chatcmpl-{n}"),
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
            (_, false) => "chat.completion",
            (_, true) => "chat.completion.chunk",
        }
    }

    /// One choice: `text` (a whole answer, or a chunk's piece), `finish` when it ends here,
    /// `first` for a stream's first chunk (chat announces the role in it).
    fn choice(
        &self,
        index: usize,
        text: &str,
        finish: Option<FinishReason>,
        streamed: bool,
        first: bool,
    ) -> Value {
        let finish = finish.map(FinishReason::as_str);
        match (self.endpoint, streamed) {
            (Endpoint::Completions, _) => {
                json!({"index": index, "text": text, "logprobs": null, "finish_reason": finish})
            }
            (_, false) => json!({
                "index": index,
                "message": {"role": "assistant", "content": text},
                "logprobs": null,
                "finish_reason": finish,
            }),
            (_, true) => {
                let delta = match (first, finish.is_some()) {
                    (_, true) => json!({}),
                    (true, false) => json!({"role": "assistant", "content": text}),
                    (false, false) => json!({"content": text}),
                };
                json!({"index": index, "delta": delta, "logprobs": null, "finish_reason": finish})
            }
        }
    }

    fn body(&self, choices: Vec<Value>, streamed: bool, usage: Option<Usage>) -> Value {
        let mut v = json!({
            "id": self.id, "object": self.object(streamed), "created": self.created,
            "model": self.model, "choices": choices,
        });
        if let Some(u) = usage {
            v["usage"] = u.json();
        }
        v
    }
}

/// The whole answer at once: one choice per prompt (a batch has several, in order), usage
/// summed over them. Each receiver is read to its end before the next is asked for, so a
/// batch never holds more of the server's slots than one request does.
pub async fn collect<F, Fut>(reply: Reply, n: usize, mut serve: F) -> Result<Response, ApiError>
where
    F: FnMut(usize) -> Fut,
    Fut: std::future::Future<Output = Result<mpsc::Receiver<Chunk>, ApiError>>,
{
    let mut choices = Vec::with_capacity(n);
    let mut total = Usage::default();
    for index in 0..n {
        let (choice, usage) = collect_one(&reply, index, serve(index).await?).await?;
        choices.push(choice);
        total.prompt += usage.prompt;
        total.completion += usage.completion;
        total.cached += usage.cached;
    }
    Ok(Json(reply.body(choices, false, Some(total))).into_response())
}

async fn collect_one(
    reply: &Reply,
    index: usize,
    rx: mpsc::Receiver<Chunk>,
) -> Result<(Value, Usage), ApiError> {
    let w = crate::answer::whole(rx).await?;
    Ok((
        reply.choice(index, &w.text, Some(w.finish), false, false),
        w.usage,
    ))
}

/// The answer as server-sent events, ending with `[DONE]`; each prompt's usage rides on its
/// last chunk. `chunks` are tagged with their prompt's index (a batch streams its prompts one
/// after the other, each choice with its index; a single prompt is index 0).
pub fn stream(
    reply: Reply,
    chunks: impl futures::Stream<Item = (usize, Chunk)> + Send + 'static,
) -> Response {
    let mut first = std::collections::HashSet::new();
    let events = chunks.map(move |(index, c)| {
        let data = match c {
            Chunk::Text(t) => {
                let choice = reply.choice(index, &t, None, true, first.insert(index));
                reply.body(vec![choice], true, None).to_string()
            }
            Chunk::Done(reason, usage) => {
                let choice = reply.choice(index, "", Some(reason), true, first.insert(index));
                reply.body(vec![choice], true, Some(usage)).to_string()
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
