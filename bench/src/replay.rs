//! Replay of a trace through Envoy with streaming requests; time to first token is the
//! arrival of the first SSE chunk that carries text.
//!
//! Open loop ([`Arrivals::Scheduled`]): each request is sent at its scheduled time whatever the
//! earlier ones are doing, so throughput follows the offered rate. Closed loop
//! ([`Arrivals::Saturated`]): a fixed number of clients send the trace's requests in order as
//! fast as they are answered, so throughput is what the fleet can do under that routing.

use super::trace::TraceRequest;
use eventsource_stream::Eventsource;
use futures::StreamExt;
use serde::Serialize;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::Semaphore;

#[derive(Debug, Clone, Serialize)]
pub struct Outcome {
    /// When it was sent, from the replay's start (closed loop: when a client was free).
    pub at_ms: f64,
    pub status: u16,
    pub ttft_ms: Option<f64>,
    pub e2e_ms: f64,
    pub output_tokens: u64,
    pub pod: String,
    /// The filter's reason (`x-prefix-router-reason`; only with its debug headers on:
    /// `BENCH_DEBUG_HEADERS=1`).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub reason: String,
    /// Leading blocks the chosen pod was taken to hold (`x-prefix-router-matched-blocks`,
    /// debug headers only).
    #[serde(default)]
    pub matched_blocks: usize,
    /// Prompt tokens, and those the pod found in its prefix cache, from the answer's usage
    /// (`prompt_tokens_details.cached_tokens`; 0 when the pod does not report them).
    #[serde(default)]
    pub prompt_tokens: u64,
    #[serde(default)]
    pub cached_tokens: u64,
    pub error: Option<String>,
}

impl Outcome {
    pub fn ok(&self) -> bool {
        self.status == 200 && self.error.is_none()
    }
}

fn chunk_text(v: &serde_json::Value) -> Option<&str> {
    let c = &v["choices"][0];
    c["text"]
        .as_str()
        .or_else(|| c["delta"]["content"].as_str())
}

async fn one(
    http: reqwest::Client,
    url: String,
    r: TraceRequest,
    start: Instant,
    timeout: Duration,
) -> Outcome {
    let due = start + Duration::from_secs_f64(r.at_ms / 1000.0);
    tokio::time::sleep_until(due.into()).await;
    let sent = Instant::now();
    let mut out = Outcome {
        at_ms: sent.duration_since(start).as_secs_f64() * 1000.0,
        status: 0,
        ttft_ms: None,
        e2e_ms: 0.0,
        output_tokens: 0,
        pod: String::new(),
        reason: String::new(),
        matched_blocks: 0,
        prompt_tokens: 0,
        cached_tokens: 0,
        error: None,
    };
    let work = async {
        let resp = http
            .post(&url)
            .json(&r.body)
            .send()
            .await
            .map_err(|e| e.to_string())?;
        out.status = resp.status().as_u16();
        out.pod = resp
            .headers()
            .get(prefix_core::protocol::headers::POD)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_owned();
        out.reason = resp
            .headers()
            .get(prefix_core::protocol::headers::debug::REASON)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_owned();
        out.matched_blocks = resp
            .headers()
            .get(prefix_core::protocol::headers::debug::MATCHED_BLOCKS)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        let mut events = resp.bytes_stream().eventsource();
        let mut counted = 0u64;
        while let Some(event) = events.next().await {
            let data = event.map_err(|e| e.to_string())?.data;
            if data == "[DONE]" {
                continue;
            }
            let v: serde_json::Value = serde_json::from_str(&data).map_err(|e| e.to_string())?;
            if v.get("error").is_some() {
                return Err(format!("stream error: {data}"));
            }
            if chunk_text(&v).is_some_and(|t| !t.is_empty()) {
                if out.ttft_ms.is_none() {
                    out.ttft_ms = Some(sent.elapsed().as_secs_f64() * 1000.0);
                }
                counted += 1;
            }
            if let Some(n) = v["usage"]["completion_tokens"].as_u64() {
                counted = n;
            }
            if let Some(n) = v["usage"]["prompt_tokens"].as_u64() {
                out.prompt_tokens = n;
            }
            if let Some(n) = v["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64() {
                out.cached_tokens = n;
            }
        }
        out.output_tokens = counted;
        Ok::<(), String>(())
    };
    match tokio::time::timeout(timeout, work).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => out.error = Some(e),
        Err(_) => out.error = Some(format!("timed out after {timeout:?}")),
    }
    out.e2e_ms = sent.elapsed().as_secs_f64() * 1000.0;
    out
}

/// How requests are released.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Arrivals {
    /// at each request's `at_ms`
    Scheduled,
    /// `concurrency` clients back to back, schedule ignored
    Saturated { concurrency: usize },
}

/// Replays `trace` against `base` (e.g. `http://127.0.0.1:10000`); `tick` is called as each
/// request finishes.
pub fn replay(
    base: &str,
    trace: &[TraceRequest],
    arrivals: Arrivals,
    per_request_timeout: Duration,
    tick: impl Fn() + Send + Sync,
) -> anyhow::Result<Vec<Outcome>> {
    if !base.starts_with("http://127.0.0.1:") {
        anyhow::bail!("load is only ever sent to 127.0.0.1");
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(64)
        .build()?;
    rt.block_on(async {
        let start = Instant::now();
        let slots = match arrivals {
            Arrivals::Scheduled => None,
            Arrivals::Saturated { concurrency } => {
                Some(Arc::new(Semaphore::new(concurrency.max(1))))
            }
        };
        let mut tasks = futures::stream::FuturesOrdered::new();
        for r in trace {
            let url = format!("{base}{}", r.path);
            let mut r = r.clone();
            let http = http.clone();
            let slots = slots.clone();
            if slots.is_some() {
                r.at_ms = 0.0;
            }
            tasks.push_back(tokio::spawn(async move {
                // FIFO permits: requests go out in trace order as clients free up
                let _permit = match &slots {
                    Some(s) => s.clone().acquire_owned().await.ok(),
                    None => None,
                };
                one(http, url, r, start, per_request_timeout).await
            }));
        }
        let mut outcomes = Vec::with_capacity(trace.len());
        while let Some(res) = tasks.next().await {
            outcomes.push(res?);
            tick();
        }
        Ok(outcomes)
    })
}

/// The `q` quantile (0–1) of `values` (nearest rank); NaN when empty.
pub fn quantile(values: &[f64], q: f64) -> f64 {
    if values.is_empty() {
        return f64::NAN;
    }
    let mut v = values.to_vec();
    v.sort_by(|a, b| a.total_cmp(b));
    let idx = ((q * v.len() as f64).ceil() as usize).clamp(1, v.len()) - 1;
    v[idx]
}

#[cfg(test)]
mod tests {
    #[test]
    fn quantiles() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(super::quantile(&v, 0.5), 50.0);
        assert_eq!(super::quantile(&v, 0.99), 99.0);
        assert_eq!(super::quantile(&v, 1.0), 100.0);
        assert!(super::quantile(&[], 0.5).is_nan());
    }
}
