//! HTTP endpoints: OpenAI completions and chat, models, health, metrics, `/tokenize` and the
//! cache events. Every response, errors included, carries `x-inference-pod`; every error is
//! an OpenAI-style JSON body. Serving itself is [`crate::pipeline`]; the response shapes are
//! [`crate::openai`].

use crate::state::AppState;
use crate::{anthropic, openai, pipeline, responses_api};
use axum::body::Bytes;
use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use futures::StreamExt;
use prefix_core::protocol::{headers, LoadReport, EVENTS_PATH};
use prefix_core::request::{parse_request, Endpoint, InferenceRequest, PromptInput};
use prefix_core::{ApiError, PreparedPrompt};
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::Instant;

pub fn router(state: Arc<AppState>) -> Router {
    let pod = HeaderValue::from_str(&state.pod).unwrap_or(HeaderValue::from_static("invalid"));
    // as vLLM's --api-key: every /v1 path wants `Authorization: Bearer <key>`
    let key = state
        .config
        .api_key
        .as_ref()
        .map(|k| Arc::<str>::from(format!("Bearer {}", k.expose())));
    Router::new()
        .route("/v1/completions", post(completions))
        .route("/v1/chat/completions", post(chat_completions))
        .route("/v1/responses", post(responses))
        .route("/v1/messages", post(messages))
        .route("/v1/models", get(models))
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .route("/tokenize", post(tokenize))
        .route(EVENTS_PATH, get(cache_events))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .with_state(state)
        .layer(axum::middleware::from_fn(
            move |req: Request, next: axum::middleware::Next| {
                let key = key.clone();
                async move {
                    let wanted = key.filter(|_| req.uri().path().starts_with("/v1"));
                    match wanted {
                        Some(k) if !authorized(&req, &k) => {
                            error_response(&ApiError::unauthorized())
                        }
                        _ => next.run(req).await,
                    }
                }
            },
        ))
        .layer(axum::middleware::map_response(move |mut res: Response| {
            let pod = pod.clone();
            async move {
                res.headers_mut().insert(headers::POD, pod);
                res
            }
        }))
}

/// Whether the request carries exactly `bearer` (`Bearer <key>`), compared without an early
/// exit on the first differing byte.
fn authorized(req: &Request, bearer: &str) -> bool {
    let got = req
        .headers()
        .get(header::AUTHORIZATION)
        .map(HeaderValue::as_bytes)
        .unwrap_or_default();
    got.len() == bearer.len()
        && got
            .iter()
            .zip(bearer.as_bytes())
            .fold(0u8, |acc, (a, b)| acc | (a ^ b))
            == 0
}

pub(crate) fn error_response(e: &ApiError) -> Response {
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
        work: s.metrics.work(
            s.config.max_num_seqs,
            s.cache.capacity() * s.cache.block_size(),
        ),
    };
    Json(page).into_response()
}

async fn models(State(s): State<Arc<AppState>>) -> Json<Value> {
    let base = s.bundle.name();
    let card = |id: &str, parent: Option<&str>| {
        json!({
            "id": id,
            "object": "model",
            "created": openai::unix_now(),
            "owned_by": "prefix-router",
            "root": base,
            "parent": parent,
            "max_model_len": s.config.max_model_len,
        })
    };
    // as vLLM lists LoRA modules: each with the base model as its parent
    let data: Vec<Value> = std::iter::once(card(base, None))
        .chain(s.bundle.aliases().iter().map(|a| card(a, None)))
        .chain(s.bundle.adapters().iter().map(|a| card(a, Some(base))))
        .collect();
    Json(json!({"object": "list", "data": data}))
}

/// Bodies over this many bytes wait for a turn to be tokenized ([`AppState::large_turns`]).
const LARGE_BODY_BYTES: usize = 64 * 1024;

/// Parses, renders and tokenizes a request on a blocking thread, never on an async worker.
/// Large bodies take turns, fewer than the cores, so however many arrive at once a core is
/// left for the small requests, which never wait for a turn.
async fn prepare_off_workers(
    s: &Arc<AppState>,
    endpoint: Endpoint,
    body: Bytes,
) -> Result<Vec<(InferenceRequest, PreparedPrompt)>, ApiError> {
    let _turn = large_turn(s, body.len()).await?;
    let state = Arc::clone(s);
    tokio::task::spawn_blocking(move || prepare(&state, endpoint, &body))
        .await
        .map_err(|e| ApiError::internal(format!("tokenizing failed: {e}")))?
}

/// A turn to tokenize a body of `bytes` bytes: `None` (no wait) for a small one.
async fn large_turn(
    s: &AppState,
    bytes: usize,
) -> Result<Option<tokio::sync::SemaphorePermit<'_>>, ApiError> {
    if bytes <= LARGE_BODY_BYTES {
        return Ok(None);
    }
    s.large_turns
        .acquire()
        .await
        .map(Some)
        .map_err(|_| ApiError::internal("the tokenizer pool is closed"))
}

/// A request's prompts, each checked against the context before any runs (a bad one rejects
/// the batch, as in vLLM). A batch becomes one request per prompt without copying the batch
/// into each.
fn prepare(
    s: &AppState,
    endpoint: Endpoint,
    body: &[u8],
) -> Result<Vec<(InferenceRequest, PreparedPrompt)>, ApiError> {
    let mut r = parse_request(endpoint, body)?;
    let prompts = match std::mem::replace(&mut r.prompt, PromptInput::Batch(Vec::new())) {
        PromptInput::Batch(prompts) => prompts,
        one => vec![one],
    };
    let most = s.config.max_batch_prompts;
    if prompts.len() > most {
        return Err(ApiError::invalid(
            format!(
                "a request may hold at most {most} prompts (--max-batch-prompts); it has {}",
                prompts.len()
            ),
            Some("prompt"),
        ));
    }
    let max = s.config.max_model_len;
    prompts
        .into_iter()
        .map(|prompt| {
            let one = InferenceRequest {
                prompt,
                ..r.clone()
            };
            let p = s.bundle.prepare_within(&one, max)?;
            pipeline::check_lengths(&s.config, &one, p.tokens.len())?;
            Ok((one, p))
        })
        .collect()
}

/// Most bytes of a refused over-long body read before answering 413.
const DRAIN_BYTES: usize = 16 << 20;

/// Reads the body, refusing (413) anything over `limit` without buffering it.
async fn read_body(req: Request, limit: usize) -> Result<Bytes, ApiError> {
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        // read (and drop) what the client sends anyway, up to a bound, so that it reads the
        // 413 instead of a connection reset in the middle of its upload
        let mut body = req.into_body().into_data_stream();
        let mut drained = 0usize;
        while drained <= DRAIN_BYTES {
            match body.next().await {
                Some(Ok(chunk)) => drained += chunk.len(),
                _ => break,
            }
        }
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
        let _turn = large_turn(&s, body.len()).await?;
        let state = Arc::clone(&s);
        tokio::task::spawn_blocking(move || {
            // A body with `messages` is a chat request; anything else is a completions request.
            let endpoint = match serde_json::from_slice::<Value>(&body) {
                Ok(v) if v.get("messages").is_some() => Endpoint::ChatCompletions,
                _ => Endpoint::Completions,
            };
            let r = parse_request(endpoint, &body)?;
            let p = state.bundle.prepare(&r)?;
            Ok::<_, ApiError>(json!({
                "model": state.bundle.name(),
                "count": p.tokens.len(),
                "max_model_len": state.config.max_model_len,
                "block_size": state.bundle.block_size().get(),
                "cache_salt": r.cache_salt,
                "tokens": p.tokens,
                "block_hashes": p.hashes,
            }))
        })
        .await
        .map_err(|e| ApiError::internal(format!("tokenizing failed: {e}")))?
    }
    .await;
    match result {
        Ok(j) => Json(j).into_response(),
        Err(e) => error_response(&e),
    }
}

async fn completions(State(s): State<Arc<AppState>>, req: Request) -> Response {
    serve_inference(s, Endpoint::Completions, req).await
}

async fn chat_completions(State(s): State<Arc<AppState>>, req: Request) -> Response {
    serve_inference(s, Endpoint::ChatCompletions, req).await
}

async fn responses(State(s): State<Arc<AppState>>, req: Request) -> Response {
    serve_inference(s, Endpoint::Responses, req).await
}

async fn messages(State(s): State<Arc<AppState>>, req: Request) -> Response {
    serve_inference(s, Endpoint::Messages, req).await
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

async fn inference(
    s: &Arc<AppState>,
    endpoint: Endpoint,
    req: Request,
) -> Result<Response, ApiError> {
    let started = Instant::now();
    let body = read_body(req, s.config.max_body_bytes).await?;
    if s.admission.is_full() {
        // refused before any work, as it would be after it
        return Err(ApiError::overloaded(
            "the server's request queue is full; retry later",
        ));
    }
    let mut work = prepare_off_workers(s, endpoint, body).await?;
    let stream = work.first().is_some_and(|(r, _)| r.stream);
    if matches!(endpoint, Endpoint::Responses | Endpoint::Messages) {
        // one prompt each: no batches in these APIs
        let (one, prompt) = work
            .pop()
            .ok_or_else(|| ApiError::internal("empty request"))?;
        if let Some(id) = &one.previous_response {
            return Err(responses_api::not_stored(id));
        }
        let rx = pipeline::serve(s, &one, prompt, started).await?;
        let model = s.bundle.name();
        return match (endpoint, stream) {
            (Endpoint::Responses, false) => responses_api::collect(model, rx).await,
            (Endpoint::Responses, true) => Ok(responses_api::stream(model, rx)),
            (_, false) => anthropic::collect(model, rx).await,
            (_, true) => Ok(anthropic::stream(model, rx)),
        };
    }
    let reply = openai::Reply::new(endpoint, s.bundle.name());
    let n = work.len();
    let mut work = work.into_iter();
    if !stream {
        return openai::collect(reply, n, |_| {
            let next = work.next();
            async move {
                let (one, prompt) = next.ok_or_else(|| ApiError::internal("batch ended early"))?;
                pipeline::serve(s, &one, prompt, started).await
            }
        })
        .await;
    }
    // streamed: the first prompt is admitted before the response starts (so a full server
    // still answers 429); the rest run one after the other as the stream is read
    let (one, prompt) = work
        .next()
        .ok_or_else(|| ApiError::internal("empty batch"))?;
    let first = pipeline::serve(s, &one, prompt, started).await?;
    let state = Arc::clone(s);
    let rest = futures::stream::iter(work.enumerate()).then(move |(i, (one, prompt))| {
        let state = Arc::clone(&state);
        async move {
            match pipeline::serve(&state, &one, prompt, started).await {
                Ok(rx) => tokio_stream::wrappers::ReceiverStream::new(rx)
                    .map(move |c| (i + 1, c))
                    .left_stream(),
                Err(e) => {
                    futures::stream::once(
                        async move { (i + 1, pipeline::Chunk::Failed(e.message)) },
                    )
                    .right_stream()
                }
            }
        }
    });
    let chunks = tokio_stream::wrappers::ReceiverStream::new(first)
        .map(|c| (0, c))
        .chain(rest.flatten());
    Ok(openai::stream(reply, chunks))
}
