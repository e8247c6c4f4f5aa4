//! HTTP endpoints: OpenAI completions and chat, models, health, metrics, `/tokenize` and the
//! cache events. Every response, errors included, carries `x-inference-pod`; every error is
//! an OpenAI-style JSON body. Serving itself is [`crate::pipeline`]; the response shapes are
//! [`crate::openai`].

use crate::state::AppState;
use crate::{openai, pipeline};
use axum::body::Bytes;
use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use futures::StreamExt;
use prefix_core::protocol::{headers, LoadReport, EVENTS_PATH};
use prefix_core::request::{parse_request, Endpoint, InferenceRequest, PromptInput};
use prefix_core::ApiError;
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::Instant;

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
        .chain(s.bundle.adapters().iter().map(|a| card(a, Some(base))))
        .collect();
    Json(json!({"object": "list", "data": data}))
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

async fn inference(
    s: &Arc<AppState>,
    endpoint: Endpoint,
    req: Request,
) -> Result<Response, ApiError> {
    let started = Instant::now();
    let body = read_body(req, s.config.max_body_bytes).await?;
    let r = parse_request(endpoint, &body)?;
    // a batch is answered as vLLM does: one choice per prompt, in order
    let requests = match &r.prompt {
        PromptInput::Batch(prompts) => prompts
            .iter()
            .map(|p| InferenceRequest {
                prompt: p.clone(),
                ..r.clone()
            })
            .collect(),
        _ => vec![r.clone()],
    };
    // every prompt is checked before any runs: a bad one rejects the batch, as in vLLM
    let prompts = requests
        .iter()
        .map(|one| s.bundle.prepare(one))
        .collect::<Result<Vec<_>, _>>()?;
    let reply = openai::Reply::new(endpoint, s.bundle.name());
    let n = requests.len();
    let mut work = requests.into_iter().zip(prompts);
    if !r.stream {
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
