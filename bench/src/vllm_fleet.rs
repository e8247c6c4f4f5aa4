//! Prefix routing on three real vLLM pods (the CPU build), against round robin and the peer
//! routers, with the pods' own KV-cache events (the `kv-events` sidecars) and without them
//! (the filter then follows vLLM's `/metrics` and keeps its own records of what it sent where).
//!
//! vLLM takes a minute or two to start, so one fleet serves every front: before each, every
//! pod's prefix cache is emptied (vLLM's dev-mode `POST /reset_prefix_cache`, then a one-token
//! request: vLLM publishes events only at an engine step) and the sidecars are waited for
//! until they hold nothing. Hit rates are the pods' own counters (deltas over the
//! run). The caches are small (48 blocks) so that the tenants' contexts do not all fit on one
//! pod: where a prompt goes matters.

use crate::peers::{self, Front, Peer};
use crate::policies::{each_pod, Running};
use crate::replay::{quantile, replay, Arrivals};
use crate::trace::{generate, TraceParams, Workload};
use serde::Serialize;
use std::path::Path;
use std::time::{Duration, Instant};
use test_harness::cluster::{
    client, pod_metric, start_envoy_unvalidated, start_pods_of, Pod, PodKind,
};
use test_harness::fleet::pod_defaults;

/// Prefix-cache blocks per vLLM pod in this benchmark.
pub const CACHE_BLOCKS: u32 = 48;

#[derive(Debug, Serialize)]
pub struct VllmRow {
    pub front: String,
    pub requests: usize,
    pub ok: usize,
    pub ttft_p50_ms: f64,
    pub ttft_p90_ms: f64,
    pub requests_per_s: f64,
    pub hit_rate: f64,
    /// requests served per pod
    pub per_pod: Vec<f64>,
}

/// The fronts compared, in table order.
fn fronts() -> Vec<(String, Option<Front>, bool)> {
    let mut f = vec![
        (
            "prefix + vLLM events".to_owned(),
            Some(Front::Envoy("prefix")),
            true,
        ),
        (
            "prefix, metrics only".to_owned(),
            Some(Front::Envoy("prefix")),
            false,
        ),
        (
            "round_robin".to_owned(),
            Some(Front::Envoy("round_robin")),
            false,
        ),
    ];
    for peer in [Peer::Vllm, Peer::Sglang] {
        let front = Front::Peer(peer, "cache_aware");
        if peer.bin().is_file() {
            f.push((front.name().to_owned(), Some(front), false));
        } else {
            println!(
                "   ({} not installed: scripts/install-peers.sh)",
                front.name()
            );
        }
    }
    f
}

pub fn run(requests: usize, concurrency: usize, dir: &Path) -> anyhow::Result<Vec<VllmRow>> {
    let blocks = CACHE_BLOCKS.to_string();
    let pods = start_pods_of(
        PodKind::Vllm,
        3,
        &["--num-gpu-blocks-override", &blocks],
        dir,
    )?;
    let addrs: Vec<String> = pods.iter().map(|p| p.addr.clone()).collect();
    // 12 tenants of 300–700-word contexts (~400–900 tokens): 36–84 blocks each fleet-wide
    // against 3 × 48 blocks of cache
    let trace = generate(
        Workload::SharedPrefix,
        &TraceParams {
            seed: 42,
            requests,
            rate: 100.0,
            tenants: 12,
            context_words: (300, 700),
            question_words: (8, 24),
            max_tokens: 8,
        },
    );
    let http = client();
    let sum = |name: &str| each_pod(&http, &addrs, name);
    let mut rows = Vec::new();
    for (name, front, events) in fronts() {
        let Some(front) = front else { continue };
        reset_caches(&pods)?;
        let run_dir = dir.join(name.replace([' ', ',', '+'], "-"));
        let running = start_front(front, events, &pods, &run_dir)?;
        let (hits0, queries0, served0) = (
            sum("vllm:prefix_cache_hits_total"),
            sum("vllm:prefix_cache_queries_total"),
            sum("vllm:e2e_request_latency_seconds_count"),
        );
        let started = Instant::now();
        let outcomes = replay(
            &running.url(),
            &trace,
            Arrivals::Saturated { concurrency },
            Duration::from_secs(120),
            || {},
        )?;
        let secs = started.elapsed().as_secs_f64();
        let delta = |now: Vec<f64>, before: &[f64]| -> Vec<f64> {
            now.iter().zip(before).map(|(a, b)| a - b).collect()
        };
        let hits: f64 = delta(sum("vllm:prefix_cache_hits_total"), &hits0)
            .iter()
            .sum();
        let queries: f64 = delta(sum("vllm:prefix_cache_queries_total"), &queries0)
            .iter()
            .sum();
        let per_pod = delta(sum("vllm:e2e_request_latency_seconds_count"), &served0);
        let ok: Vec<_> = outcomes.iter().filter(|o| o.ok()).collect();
        let ttfts: Vec<f64> = ok.iter().filter_map(|o| o.ttft_ms).collect();
        let row = VllmRow {
            front: name,
            requests: outcomes.len(),
            ok: ok.len(),
            ttft_p50_ms: quantile(&ttfts, 0.5),
            ttft_p90_ms: quantile(&ttfts, 0.9),
            requests_per_s: ok.len() as f64 / secs,
            hit_rate: hits / queries.max(1.0),
            per_pod,
        };
        println!(
            "   {:<28} {:>4}/{:<4} ok  {:>6.2} req/s  TTFT p50 {:>6.0} ms  p90 {:>6.0} ms  hit {:.3}  per pod {:?}",
            row.front, row.ok, row.requests, row.requests_per_s, row.ttft_p50_ms, row.ttft_p90_ms,
            row.hit_rate, row.per_pod
        );
        rows.push(row);
        drop(running);
    }
    print!("{}", ratios(&rows));
    Ok(rows)
}

/// Empties every pod's prefix cache and waits until each sidecar holds nothing.
fn reset_caches(pods: &[Pod]) -> anyhow::Result<()> {
    let http = client();
    for p in pods {
        let r = http
            .post(format!("http://{}/reset_prefix_cache", p.addr))
            .send()?;
        if !r.status().is_success() {
            anyhow::bail!("{}: reset_prefix_cache answered {}", p.addr, r.status());
        }
        // vLLM publishes events at its engine's next step: a one-token request (no full
        // block) makes it take one, and the sidecar hears the cache was cleared
        let body = serde_json::json!({
            "model": prefix_core::protocol::defaults::MODEL_NAME,
            "prompt": "reset",
            "max_tokens": 1,
        });
        crate::post_json(&http, &format!("http://{}/v1/completions", p.addr), &body)?;
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    for p in pods {
        let Some(sidecar) = p.events_addr() else {
            continue;
        };
        while pod_metric(&http, sidecar, "kv_events_held_blocks").unwrap_or(1.0) > 0.0 {
            if Instant::now() > deadline {
                anyhow::bail!("{}'s sidecar still holds blocks after the reset", p.addr);
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    Ok(())
}

fn start_front(front: Front, events: bool, pods: &[Pod], dir: &Path) -> anyhow::Result<Running> {
    let addrs: Vec<String> = pods.iter().map(|p| p.addr.clone()).collect();
    Ok(match front {
        Front::Envoy(policy) => {
            let envoy = start_envoy_unvalidated(
                "envoy",
                &addrs,
                true,
                |s| {
                    pod_defaults(pods, s);
                    if !events {
                        s.extra.remove("events");
                    }
                    s.policy = policy.to_owned();
                    s.debug_headers = std::env::var_os("BENCH_DEBUG_HEADERS").is_some();
                },
                dir,
            )?;
            // the filter's first polls (its tokenizer is fetched at start)
            std::thread::sleep(Duration::from_secs(2));
            Running::Envoy(envoy)
        }
        Front::Peer(peer, policy) => Running::Peer(peers::start(peer, policy, &addrs, dir)?),
    })
}

/// Each row against round robin and against the best peer on each axis.
pub fn ratios(rows: &[VllmRow]) -> String {
    let find = |n: &str| rows.iter().find(|r| r.front == n);
    let peers: Vec<&VllmRow> = rows.iter().filter(|r| r.front.contains("router")).collect();
    let best = |f: fn(&VllmRow) -> f64, higher: bool| {
        peers
            .iter()
            .map(|r| f(r))
            .fold(None, |acc: Option<f64>, v| {
                Some(match acc {
                    None => v,
                    Some(a) if higher => a.max(v),
                    Some(a) => a.min(v),
                })
            })
    };
    let mut out = String::from("   ratios (req/s ×, TTFT p90 ×, hit rate ×):\n");
    for name in ["prefix + vLLM events", "prefix, metrics only"] {
        let Some(r) = find(name) else { continue };
        if let Some(rr) = find("round_robin") {
            out += &format!(
                "   {name:<24} vs round_robin:  {:.2}  {:.2}  {:.2}\n",
                r.requests_per_s / rr.requests_per_s,
                r.ttft_p90_ms / rr.ttft_p90_ms,
                r.hit_rate / rr.hit_rate.max(1e-9)
            );
        }
        if let (Some(rps), Some(p90), Some(hit)) = (
            best(|r| r.requests_per_s, true),
            best(|r| r.ttft_p90_ms, false),
            best(|r| r.hit_rate, true),
        ) {
            out += &format!(
                "   {name:<24} vs best peer:    {:.2}  {:.2}  {:.2}\n",
                r.requests_per_s / rps,
                r.ttft_p90_ms / p90,
                r.hit_rate / hit.max(1e-9)
            );
        }
    }
    out
}
