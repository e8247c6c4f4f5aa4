//! Prefix routing against the other policies, side by side: for every workload and policy, a
//! fresh fleet of sim pods and one Envoy with the filter replay the same seeded trace.

use super::oracle::{oracle, Oracle};
use super::replay::{quantile, replay, Arrivals, Outcome};
use super::trace::{generate, write_jsonl, TraceParams, Workload};
use prefix_core::ModelBundle;
use serde::Serialize;
use std::path::Path;
use std::time::{Duration, Instant};
use test_harness::cluster::{client, pod_metric, run_dir, start_envoy_unvalidated, start_pods};

pub const POLICIES: [&str; 4] = ["prefix", "round_robin", "random", "least_loaded"];

/// The shared-prefix workload replayed closed-loop: what each policy gets out of the same fleet.
pub const SATURATED: &str = "shared-prefix-saturated";

/// The closed-loop run ([`SATURATED`]): a shared-prefix trace with more tenants than one pod's
/// cache holds (while the fleet's caches together hold them several times over), sent by a
/// fixed number of clients back to back. That is the situation prefix-aware routing exists
/// for; with few tenants and large caches every policy ends up with every prefix everywhere.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Saturation {
    /// closed-loop clients
    pub concurrency: usize,
    pub tenants: u32,
    pub requests: usize,
    /// each pod's prefix-cache capacity, in blocks
    pub cache_blocks: usize,
}

/// The sim engine's cost model for the benchmark (printed with the results).
#[derive(Debug, Clone, Copy, Serialize)]
pub struct SimCosts {
    pub ttft_base_ms: f64,
    pub prefill_us_per_token: f64,
    pub decode_ms_per_token: f64,
    pub max_num_seqs: usize,
}

impl SimCosts {
    fn args(&self) -> Vec<String> {
        vec![
            "--sim-ttft-base-ms".into(),
            self.ttft_base_ms.to_string(),
            "--sim-prefill-us-per-token".into(),
            self.prefill_us_per_token.to_string(),
            "--sim-decode-ms-per-token".into(),
            self.decode_ms_per_token.to_string(),
            "--max-num-seqs".into(),
            self.max_num_seqs.to_string(),
            "--max-model-len".into(),
            "32768".into(),
        ]
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct PolicyRun {
    pub workload: &'static str,
    pub policy: &'static str,
    pub requests: usize,
    pub ok: usize,
    pub errors: usize,
    pub ttft_p50_ms: f64,
    pub ttft_p90_ms: f64,
    pub ttft_p99_ms: f64,
    pub e2e_p50_ms: f64,
    pub e2e_p90_ms: f64,
    pub e2e_p99_ms: f64,
    pub duration_s: f64,
    pub requests_per_s: f64,
    pub output_tokens_per_s: f64,
    /// from the pods' counters, deltas over the run
    pub prompt_tokens: f64,
    pub hit_tokens: f64,
    pub hit_rate: f64,
    pub oracle: Oracle,
    pub hit_rate_vs_oracle: f64,
    /// requests served per pod, in pod order
    pub per_pod: Vec<f64>,
    /// max / mean of `per_pod`
    pub spread: f64,
    pub envoy_cpu_s_per_1k: f64,
    /// TTFTs of successful requests (for the CDF plot)
    #[serde(skip)]
    pub ttfts: Vec<f64>,
}

fn cpu_seconds(pid: Option<u32>) -> f64 {
    let Some(pid) = pid else { return 0.0 };
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return 0.0;
    };
    // fields after the command name "(…)": utime and stime are the 12th and 13th
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    (ticks(11) + ticks(12)) / 100.0
}

/// One workload × policy run on a fresh fleet.
#[allow(clippy::too_many_arguments)]
pub fn run_one(
    workload: Workload,
    arrivals: Arrivals,
    policy: &'static str,
    trace: &[super::trace::TraceRequest],
    oracle_rate: Oracle,
    pods: usize,
    costs: &SimCosts,
    cache_blocks: Option<usize>,
    tick: impl Fn() + Send + Sync,
) -> anyhow::Result<PolicyRun> {
    let name = match arrivals {
        Arrivals::Scheduled => workload.name(),
        Arrivals::Saturated { .. } => SATURATED,
    };
    let dir = run_dir(&format!("bench-{name}-{policy}"));
    let mut args = costs.args();
    if let Some(n) = cache_blocks {
        args.extend(["--cache-blocks".to_owned(), n.to_string()]);
    }
    let arg_refs: Vec<&str> = args.iter().map(String::as_str).collect();
    let fleet = start_pods(pods, &arg_refs, &dir)?;
    let addrs: Vec<String> = fleet.iter().map(|p| p.addr.clone()).collect();
    let envoy = start_envoy_unvalidated(
        "envoy",
        &addrs,
        true,
        |s| {
            s.policy = policy.to_owned();
            s.debug_headers = false;
            s.max_body_bytes = 8 * 1024 * 1024;
        },
        &dir,
    )?;
    let cpu0 = cpu_seconds(envoy.proc.pid());
    let started = Instant::now();
    let outcomes: Vec<Outcome> = replay(
        &envoy.url(""),
        trace,
        arrivals,
        Duration::from_secs(60),
        tick,
    )?;
    let duration_s = started.elapsed().as_secs_f64();
    let cpu = cpu_seconds(envoy.proc.pid()) - cpu0;

    let http = client();
    let metric = |name: &str| -> Vec<f64> {
        addrs
            .iter()
            .map(|a| pod_metric(&http, a, name).unwrap_or(0.0))
            .collect()
    };
    let hits: f64 = metric("vllm:prefix_cache_hits_total").iter().sum();
    let queries: f64 = metric("vllm:prefix_cache_queries_total").iter().sum();
    let per_pod = metric("vllm:e2e_request_latency_seconds_count");
    let ok: Vec<&Outcome> = outcomes.iter().filter(|o| o.ok()).collect();
    let ttfts: Vec<f64> = ok.iter().filter_map(|o| o.ttft_ms).collect();
    let e2e: Vec<f64> = ok.iter().map(|o| o.e2e_ms).collect();
    let out_tokens: u64 = ok.iter().map(|o| o.output_tokens).sum();
    let mean = per_pod.iter().sum::<f64>() / per_pod.len().max(1) as f64;
    let max = per_pod.iter().copied().fold(0.0, f64::max);
    let hit_rate = hits / queries.max(1.0);
    let _ = std::fs::write(
        dir.join("outcomes.json"),
        serde_json::to_vec(&outcomes).unwrap_or_default(),
    );
    Ok(PolicyRun {
        workload: name,
        policy,
        requests: outcomes.len(),
        ok: ok.len(),
        errors: outcomes.len() - ok.len(),
        ttft_p50_ms: quantile(&ttfts, 0.5),
        ttft_p90_ms: quantile(&ttfts, 0.9),
        ttft_p99_ms: quantile(&ttfts, 0.99),
        e2e_p50_ms: quantile(&e2e, 0.5),
        e2e_p90_ms: quantile(&e2e, 0.9),
        e2e_p99_ms: quantile(&e2e, 0.99),
        duration_s,
        requests_per_s: ok.len() as f64 / duration_s,
        output_tokens_per_s: out_tokens as f64 / duration_s,
        prompt_tokens: queries,
        hit_tokens: hits,
        hit_rate,
        oracle: oracle_rate,
        hit_rate_vs_oracle: if oracle_rate.hit_rate > 0.0 {
            hit_rate / oracle_rate.hit_rate
        } else {
            f64::NAN
        },
        spread: if mean > 0.0 { max / mean } else { f64::NAN },
        per_pod,
        envoy_cpu_s_per_1k: cpu / outcomes.len().max(1) as f64 * 1000.0,
        ttfts,
    })
}

/// Every workload × policy; traces saved under `out`. With `saturate` (and the shared-prefix
/// workload selected), also the closed-loop [`SATURATED`] run per policy.
#[allow(clippy::too_many_arguments)]
pub fn run_all(
    bundle: &ModelBundle,
    workloads: &[Workload],
    policies: &[&'static str],
    params: &TraceParams,
    pods: usize,
    costs: &SimCosts,
    saturate: Option<Saturation>,
    out: &Path,
) -> anyhow::Result<Vec<PolicyRun>> {
    let saturate = saturate.filter(|_| workloads.contains(&Workload::SharedPrefix));
    let total = workloads.len() * policies.len() * params.requests
        + saturate.map_or(0, |s| policies.len() * s.requests);
    let bar = indicatif::ProgressBar::new(total as u64);
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "{spinner} [{elapsed_precise}] {bar:40} {pos}/{len} requests {msg}",
        )
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    let mut runs = Vec::new();
    for &w in workloads {
        let trace = generate(w, params);
        write_jsonl(&out.join(format!("trace-{}.jsonl", w.name())), &trace)?;
        let o = oracle(bundle, &trace)?;
        for &p in policies {
            bar.set_message(format!("{} / {p}", w.name()));
            let open = Arrivals::Scheduled;
            runs.push(run_one(w, open, p, &trace, o, pods, costs, None, || {
                bar.inc(1)
            })?);
        }
    }
    if let Some(s) = saturate {
        let sat_params = TraceParams {
            tenants: s.tenants,
            requests: s.requests,
            ..*params
        };
        let trace = generate(Workload::SharedPrefix, &sat_params);
        write_jsonl(&out.join(format!("trace-{SATURATED}.jsonl")), &trace)?;
        let o = oracle(bundle, &trace)?;
        for &p in policies {
            bar.set_message(format!("{SATURATED} / {p}"));
            let closed = Arrivals::Saturated {
                concurrency: s.concurrency,
            };
            let w = Workload::SharedPrefix;
            runs.push(run_one(
                w,
                closed,
                p,
                &trace,
                o,
                pods,
                costs,
                Some(s.cache_blocks),
                || bar.inc(1),
            )?);
        }
    }
    bar.finish_and_clear();
    Ok(runs)
}
