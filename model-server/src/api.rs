//! HTTP endpoints: OpenAI completions and chat (plain and SSE streaming), models, health,
//! metrics and `/tokenize`. Every response, errors included, carries `x-inference-pod`.

use crate::engine::{Emitted, EngineError, FinishReason, GenerateRequest};
use crate::state::AppState;
use axum::body::Bytes;
use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::sse::{Event, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use futures::StreamExt;
use prefix_core::protocol::{headers, LoadReport, EVENTS_PATH};
use prefix_core::request::{parse_request, Endpoint};
use prefix_core::ApiError;
use serde_json::{json, Value};
use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

pub fn router(state: Arc<AppState>) -> Router {
    let pod = HeaderValue::from_str(&state.pod).unwrap_or(HeaderValue::from_static("invalid"));
    Router::new()
        .route("/v1/completions", post(completions))
        .route("/v1/chat/completions", post(chat_completions))
        .route("/v1/models", get(models))
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .route("/tokenize", post(tokenize))
        .route(EVENTS_PATH, get(cache_events))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .with_state(state)
        .layer(axum::middleware::map_response(move |mut res: Response| {
            let pod = pod.clone();
            async move {
                res.headers_mut().insert(headers::POD, pod);
                res
            }
        }))
}

fn error_response(e: &ApiError) -> Response {
    let status = StatusCode::from_u16(e.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        e.to_json(),
    )
        .into_response()
}

async fn not_found(req: Request) -> Response {
    error_response(
        &ApiError::not_found(
            format!("no route for {} {}", req.method(), req.uri().path()),
            None,
        )
        .with_code("not_found"),
    )
}

async fn method_not_allowed(req: Request) -> Response {
    error_response(&ApiError::method_not_allowed(
        req.method().as_str(),
        req.uri().path(),
    ))
}

async fn health(State(s): State<Arc<AppState>>) -> Json<Value> {
    Json(json!({"status": "ok", "pod": s.pod}))
}

async fn metrics(State(s): State<Arc<AppState>>) -> Response {
    s.metrics.kv_cache_usage.set(s.cache.usage());
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        s.metrics.render(),
    )
        .into_response()
}

#[derive(serde::Deserialize)]
struct EventsQuery {
    #[serde(default)]
    since: u64,
}

/// Cache events since `?since=SEQ`, plus this pod's load: one poll tells a router everything.
async fn cache_events(
    State(s): State<Arc<AppState>>,
    axum::extract::Query(q): axum::extract::Query<EventsQuery>,
) -> Response {
    let mut page = s.cache.events_since(q.since);
    page.pod.clone_from(&s.pod);
    page.load = LoadReport {
        running: u32::try_from(s.metrics.running.get()).unwrap_or(0),
        waiting: u32::try_from(s.admission.waiting()).unwrap_or(u32::MAX),
        kv_cache_usage: s.cache.usage(),
    };
    Json(page).into_response()
}

async fn models(State(s): State<Arc<AppState>>) -> Json<Value> {
    Json(json!({
        "object": "list",
        "data": [{
            "id": s.bundle.name(),
            "object": "model",
            "created": unix_now(),
            "owned_by": "prefix-router",
            "max_model_len": s.config.max_model_len,
        }]
    }))
}

/// Reads the body, refusing (413) anything over `limit` without buffering it.
async fn read_body(req: Request, limit: usize) -> Result<Bytes, ApiError> {
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(ApiError::too_large(limit));
    }
    axum::body::to_bytes(req.into_body(), limit)
        .await
        .map_err(|e| {
            if is_length_limit(&e) {
                ApiError::too_large(limit)
            } else {
                ApiError::invalid(format!("could not read request body: {e}"), None)
            }
        })
}

fn is_length_limit(e: &axum::Error) -> bool {
    let mut src: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = src {
        if err.is::<http_body_util::LengthLimitError>() {
            return true;
        }
        src = err.source();
    }
    false
}

async fn tokenize(State(s): State<Arc<AppState>>, req: Request) -> Response {
    let result = async {
        let body = read_body(req, s.config.max_body_bytes).await?;
        // A body with `messages` is a chat request; anything else is a completions request.
        let endpoint = match serde_json::from_slice::<Value>(&body) {
            Ok(v) if v.get("messages").is_some() => Endpoint::ChatCompletions,
            _ => Endpoint::Completions,
        };
        let r = parse_request(endpoint, &body)?;
        let p = s.bundle.prepare(&r)?;
        Ok::<_, ApiError>(Json(json!({
            "model": s.bundle.name(),
            "count": p.tokens.len(),
            "max_model_len": s.config.max_model_len,
            "block_size": s.bundle.block_size().get(),
            "cache_salt": r.cache_salt,
            "tokens": p.tokens,
            "block_hashes": p.hashes,
        })))
    }
    .await;
    match result {
        Ok(j) => j.into_response(),
        Err(e) => error_response(&e),
    }
}

async fn completions(State(s): State<Arc<AppState>>, req: Request) -> Response {
    serve_inference(s, Endpoint::Completions, req).await
}

async fn chat_completions(State(s): State<Arc<AppState>>, req: Request) -> Response {
    serve_inference(s, Endpoint::ChatCompletions, req).await
}

async fn serve_inference(s: Arc<AppState>, endpoint: Endpoint, req: Request) -> Response {
    match inference(&s, endpoint, req).await {
        Ok(r) => r,
        Err(e) => {
            s.metrics.requests_rejected.inc();
            if e.status >= 500 {
                tracing::error!(error = %e, "request failed");
            } else {
                tracing::debug!(error = %e, "request rejected");
            }
            error_response(&e)
        }
    }
}

/// Messages from the generation task to the response writer.
enum Chunk {
    Text(String),
    Done(FinishReason, Usage),
    Failed(String),
}

#[derive(Clone, Copy, Debug)]
struct Usage {
    prompt: usize,
    completion: usize,
    cached: usize,
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

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// Decrements a gauge when the request stops running, however it ends.
struct RunningGuard(prometheus::IntGauge);
impl Drop for RunningGuard {
    fn drop(&mut self) {
        self.0.dec();
    }
}

async fn inference(
    s: &Arc<AppState>,
    endpoint: Endpoint,
    req: Request,
) -> Result<Response, ApiError> {
    let started = Instant::now();
    let body = read_body(req, s.config.max_body_bytes).await?;
    let r = parse_request(endpoint, &body)?;
    let prompt = s.bundle.prepare(&r)?;
    let n_prompt = prompt.tokens.len();
    if n_prompt > s.config.max_model_len {
        return Err(ApiError::invalid(
            format!(
                "This model's maximum context length is {} tokens; the prompt has {n_prompt} tokens.",
                s.config.max_model_len
            ),
            Some(if endpoint == Endpoint::Completions { "prompt" } else { "messages" }),
        )
        .with_code("context_length_exceeded"));
    }
    if n_prompt == 0 {
        return Err(ApiError::invalid(
            "the prompt tokenizes to nothing",
            Some("prompt"),
        ));
    }

    let metrics = &s.metrics;
    let slot = s
        .admission
        .enter(|w| metrics.waiting.set(w as i64))
        .await
        .map_err(|_| ApiError::overloaded("the server's request queue is full; retry later"))?;
    metrics.running.inc();
    let running = RunningGuard(metrics.running.clone());

    let block_size = s.bundle.block_size().get() as usize;
    let mut lease = if s.engine.needs_kv() {
        s.cache
            .acquire_with_payloads(&prompt.hashes, n_prompt, block_size)
    } else {
        s.cache.acquire(&prompt.hashes, n_prompt, block_size)
    };
    let cached = lease.hit_blocks() * block_size;
    metrics.prefix_cache_queries.inc_by(n_prompt as u64);
    metrics.prefix_cache_hits.inc_by(cached as u64);
    metrics.prompt_tokens.inc_by(n_prompt as u64);

    let gen = GenerateRequest {
        prompt_tokens: Arc::new(prompt.tokens),
        cached_tokens: cached,
        max_tokens: r.max_tokens.unwrap_or(s.config.default_max_tokens),
        temperature: r.temperature,
        top_p: r.top_p,
        seed: r.seed,
        stop: r.stop.clone(),
        cached_kv: lease.hit_payloads().to_vec(),
        block_size,
    };
    let hashes = prompt.hashes;
    let (out_tx, out_rx) = mpsc::channel::<Chunk>(64);
    let state = Arc::clone(s);
    tokio::spawn(async move {
        let _slot = slot;
        let _running = running;
        let (tok_tx, mut tok_rx) = mpsc::channel::<Emitted>(64);
        let engine_fut = state.engine.generate(gen, tok_tx);
        let forward = async {
            let mut completion = 0usize;
            let mut payloads = Vec::new();
            let mut stored = false;
            // Prefill is done once the first token (or the engine's block payloads and then
            // the end) exists: the prompt's blocks are now computed and can be cached.
            let mut store = |payloads: Vec<crate::cache::Payload>| {
                let out = lease.store_with(&hashes, payloads);
                state.metrics.blocks_stored.inc_by(out.stored as u64);
                state.metrics.blocks_evicted.inc_by(out.evicted as u64);
                state.metrics.kv_cache_usage.set(state.cache.usage());
            };
            while let Some(emitted) = tok_rx.recv().await {
                let piece = match emitted {
                    Emitted::Blocks(p) => {
                        payloads = p;
                        continue;
                    }
                    Emitted::Token(t) => t,
                };
                if !stored {
                    stored = true;
                    store(std::mem::take(&mut payloads));
                    state.metrics.ttft.observe(started.elapsed().as_secs_f64());
                }
                completion += 1;
                if out_tx.send(Chunk::Text(piece)).await.is_err() {
                    break; // client gone; dropping tok_rx stops the engine
                }
            }
            if !stored && !payloads.is_empty() {
                store(payloads); // ended before any token (e.g. end-of-sequence first)
            }
            drop(tok_rx);
            completion
        };
        let (result, completion) = tokio::join!(engine_fut, forward);
        state.metrics.generation_tokens.inc_by(completion as u64);
        state.metrics.e2e.observe(started.elapsed().as_secs_f64());
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

    let id_num = NEXT_ID.fetch_add(1, Ordering::Relaxed);
    let (id, object) = match endpoint {
        Endpoint::Completions => (format!("cmpl-{id_num}"), "text_completion"),
        Endpoint::ChatCompletions => (format!("chatcmpl-{id_num}"), "chat.completion"),
    };
    let model = s.bundle.name().to_owned();
    if r.stream {
        Ok(stream_response(endpoint, id, model, out_rx))
    } else {
        collect_response(endpoint, id, object, model, out_rx).await
    }
}

async fn collect_response(
    endpoint: Endpoint,
    id: String,
    object: &str,
    model: String,
    mut rx: mpsc::Receiver<Chunk>,
) -> Result<Response, ApiError> {
    let mut text = String::new();
    while let Some(c) = rx.recv().await {
        match c {
            Chunk::Text(t) => text.push_str(&t),
            Chunk::Failed(e) => return Err(ApiError::internal(e)),
            Chunk::Done(reason, usage) => {
                let choice = match endpoint {
                    Endpoint::Completions => json!({
                        "index": 0, "text": text, "logprobs": null, "finish_reason": reason.as_str(),
                    }),
                    Endpoint::ChatCompletions => json!({
                        "index": 0,
                        "message": {"role": "assistant", "content": text},
                        "logprobs": null,
                        "finish_reason": reason.as_str(),
                    }),
                };
                return Ok(Json(json!({
                    "id": id, "object": object, "created": unix_now(), "model": model,
                    "choices": [choice], "usage": usage.json(),
                }))
                .into_response());
            }
        }
    }
    Err(ApiError::internal("generation ended without a result"))
}

fn stream_response(
    endpoint: Endpoint,
    id: String,
    model: String,
    rx: mpsc::Receiver<Chunk>,
) -> Response {
    let created = unix_now();
    let object = match endpoint {
        Endpoint::Completions => "text_completion",
        Endpoint::ChatCompletions => "chat.completion.chunk",
    };
    let mut first = true;
    let frame = move |choice: Value, usage: Option<Value>| {
        let mut v = json!({"id": id, "object": object, "created": created, "model": model, "choices": [choice]});
        if let Some(u) = usage {
            v["usage"] = u;
        }
        Event::default().data(v.to_string())
    };
    let events = ReceiverStream::new(rx).map(move |c| {
        let ev = match c {
            Chunk::Text(t) => {
                let choice = match endpoint {
                    Endpoint::Completions => json!({"index": 0, "text": t, "logprobs": null, "finish_reason": null}),
                    Endpoint::ChatCompletions => {
                        let delta = if first { json!({"role": "assistant", "content": t}) } else { json!({"content": t}) };
                        json!({"index": 0, "delta": delta, "logprobs": null, "finish_reason": null})
                    }
                };
                first = false;
                frame(choice, None)
            }
            Chunk::Done(reason, usage) => {
                let choice = match endpoint {
                    Endpoint::Completions => json!({"index": 0, "text": "", "logprobs": null, "finish_reason": reason.as_str()}),
                    Endpoint::ChatCompletions => json!({"index": 0, "delta": {}, "logprobs": null, "finish_reason": reason.as_str()}),
                };
                frame(choice, Some(usage.json()))
            }
            Chunk::Failed(e) => Event::default().data(ApiError::internal(e).to_json()),
        };
        Ok::<_, Infallible>(ev)
    });
    let done =
        futures::stream::once(async { Ok::<_, Infallible>(Event::default().data("[DONE]")) });
    let mut res = Sse::new(events.chain(done)).into_response();
    res.headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    res
}
