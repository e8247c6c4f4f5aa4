//! Prefix routing against the other policies and the peer routers, side by side: for every
//! workload and front (Envoy with the filter under a policy, or a peer router), a fresh fleet
//! of sim pods replays the same seeded trace through that front.

use super::inference_perf::{self, IpSummary, IpWorkload};
use super::oracle::{oracle, Oracle};
use super::overhead::{FilterTimes, Span};
use super::peers::{self, Front};
use super::replay::{quantile, replay, Arrivals, Outcome};
use super::trace::{generate, write_jsonl, TraceParams, Workload};
use prefix_core::ModelBundle;
use serde::Serialize;
use std::path::Path;
use std::time::{Duration, Instant};
use test_harness::cluster::{client, pod_metric, run_dir, start_envoy_unvalidated, start_pods};

/// The shared-prefix workload replayed closed-loop with many groups: what each front gets out
/// of the same fleet.
pub const SATURATED: &str = "shared-prefix-saturated";

/// The same, with a few hot groups that every pod's cache could hold.
pub const HOT_SATURATED: &str = "hot-groups-saturated";

/// Long shared prefixes (4k–8k tokens) with longer questions, and caches that hold only a
/// part of the working set: where a cold prefill costs more than queueing behind an owner.
pub const LONG_SATURATED: &str = "long-prefix-saturated";

/// The closed-loop situations again, generated and sent by inference-perf.
pub const IP_MANY_GROUPS: &str = "ip-many-groups";
pub const IP_HOT_GROUPS: &str = "ip-hot-groups";
pub const IP_LONG_PREFIX: &str = "ip-long-prefix";

/// Every closed-loop workload, replayed or inference-perf's, in the order they run.
pub const CLOSED_LOOP: [&str; 6] = [
    SATURATED,
    HOT_SATURATED,
    LONG_SATURATED,
    IP_MANY_GROUPS,
    IP_HOT_GROUPS,
    IP_LONG_PREFIX,
];

/// A closed-loop run: a shared-prefix trace sent by a fixed number of clients back to back.
/// With more tenants than one pod's cache holds (while the fleet's caches together hold them
/// several times over: [`SATURATED`]) that is the situation prefix-aware routing exists for;
/// with a few tenants that fit everywhere ([`HOT_SATURATED`]) warming every pod and balancing
/// is what wins.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Saturation {
    /// the run's workload name in the tables
    pub name: &'static str,
    /// closed-loop clients
    pub concurrency: usize,
    pub tenants: u32,
    pub requests: usize,
    /// each pod's prefix-cache capacity, in blocks
    pub cache_blocks: usize,
    /// shared contexts' and questions' lengths in words (`None`: the trace's own)
    pub context_words: Option<(usize, usize)>,
    pub question_words: Option<(usize, usize)>,
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

#[derive(Debug, Clone, Default, Serialize)]
pub struct PolicyRun {
    /// which of the `--repeat` runs (1-based; 0 for the medians of [`crate::repeats`])
    pub run: usize,
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
    /// CPU seconds the front (Envoy, or the peer router) spent per 1000 requests
    pub front_cpu_s_per_1k: f64,
    /// the filter's own time per request over the whole run (its histograms; not for the
    /// peers, nor the floor filter)
    pub filter: FilterTimes,
    /// TTFTs of successful requests (for the CDF plot)
    #[serde(skip)]
    pub ttfts: Vec<f64>,
}

fn cpu_seconds(pid: Option<u32>) -> f64 {
    super::overhead::cpu_seconds(pid).unwrap_or(0.0)
}

/// The filter's time per request over the whole run: cumulative quantiles (this Envoy served
/// only this run), read once a stats flush has found no new samples, so the run's last
/// requests are in them. Polls for at most a few flush intervals.
fn filter_times(envoy: &test_harness::cluster::Envoy) -> FilterTimes {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let stats = super::overhead::filter_stats(envoy);
        let all = FilterTimes::of(&stats, Span::Cumulative);
        let flushed_idle = FilterTimes::of(&stats, Span::Interval).route_us.is_none();
        if (all.route_us.is_some() && flushed_idle) || Instant::now() >= deadline {
            if std::env::var_os("BENCH_DUMP_STATS").is_some() {
                eprintln!("{stats}");
            }
            return all;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The process in front of the pods for one run.
pub(crate) enum Running {
    Envoy(test_harness::cluster::Envoy),
    Peer(peers::PeerRouter),
}

impl Running {
    fn start(front: Front, addrs: &[String], dir: &Path) -> anyhow::Result<Running> {
        Ok(match front {
            Front::Envoy(policy) => Running::Envoy(start_envoy_unvalidated(
                "envoy",
                addrs,
                true,
                |s| {
                    s.policy = policy.to_owned();
                    // on only to study decisions (the replay then records each reason)
                    s.debug_headers = std::env::var_os("BENCH_DEBUG_HEADERS").is_some();
                    s.max_body_bytes = 8 * 1024 * 1024;
                    // the filter's histograms reach the admin only at a flush (filter_times)
                    s.stats_flush_interval = Some(super::overhead::FLUSH.into());
                    // plugin-config fields to try (`{"weights":{"imbalance_abs":16}}`)
                    if let Ok(v) = std::env::var("BENCH_PLUGIN_EXTRA") {
                        match serde_json::from_str(&v) {
                            Ok(extra) => s.extra = extra,
                            Err(e) => {
                                eprintln!("BENCH_PLUGIN_EXTRA ignored (not a JSON object: {e})")
                            }
                        }
                    }
                },
                dir,
            )?),
            Front::Peer(peer, policy) => Running::Peer(peers::start(peer, policy, addrs, dir)?),
        })
    }

    pub(crate) fn url(&self) -> String {
        match self {
            Running::Envoy(e) => e.url(""),
            Running::Peer(p) => p.url(""),
        }
    }

    fn pid(&self) -> Option<u32> {
        match self {
            Running::Envoy(e) => e.proc.pid(),
            Running::Peer(p) => p.proc.pid(),
        }
    }
}

/// What loads the front in one run.
pub enum Driver<'a> {
    /// The project's replay of a trace (oracle computed on the same trace).
    Replay {
        trace: &'a [super::trace::TraceRequest],
        arrivals: Arrivals,
        oracle: Oracle,
    },
    /// inference-perf with its own workload.
    InferencePerf(&'a IpWorkload),
}

/// What the load generator measured of one run.
struct Measured {
    requests: usize,
    ok: usize,
    ttft_ms: [f64; 3],
    e2e_ms: [f64; 3],
    duration_s: f64,
    output_tokens: f64,
    /// TTFTs of successful requests, when the generator reports them one by one
    ttfts: Vec<f64>,
}

impl Measured {
    fn of_outcomes(outcomes: &[Outcome], duration_s: f64) -> Measured {
        let ok: Vec<&Outcome> = outcomes.iter().filter(|o| o.ok()).collect();
        let ttfts: Vec<f64> = ok.iter().filter_map(|o| o.ttft_ms).collect();
        let e2e: Vec<f64> = ok.iter().map(|o| o.e2e_ms).collect();
        let q = |v: &[f64]| [0.5, 0.9, 0.99].map(|x| quantile(v, x));
        Measured {
            requests: outcomes.len(),
            ok: ok.len(),
            ttft_ms: q(&ttfts),
            e2e_ms: q(&e2e),
            duration_s,
            output_tokens: ok.iter().map(|o| o.output_tokens as f64).sum(),
            ttfts,
        }
    }

    fn of_inference_perf(s: &IpSummary) -> Measured {
        Measured {
            requests: s.ok + s.errors,
            ok: s.ok,
            ttft_ms: s.ttft_ms,
            e2e_ms: s.e2e_ms,
            duration_s: s.duration_s,
            output_tokens: s.output_tokens,
            ttfts: Vec::new(),
        }
    }
}

/// The filter's decisions by reason over the run, from Envoy's counters
/// (`prefix_router_decisions{reason,model}`, summed over models): `prefix_hit 812, cold 130,
/// …`, most first.
fn decision_counts(envoy: &test_harness::cluster::Envoy) -> String {
    use strum::IntoEnumIterator;
    let text = client()
        .get(envoy.admin_url("/stats/prometheus"))
        .send()
        .and_then(|r| r.text())
        .unwrap_or_default();
    let mut counts: Vec<(String, f64)> = prefix_core::policy::ReasonKind::iter()
        .map(|k| k.metric_suffix())
        .filter_map(|r| {
            let series = format!("prefix_router_decisions{{reason=\"{r}\"}}");
            let n = test_harness::cluster::metric_value(&text, &series)?;
            (n > 0.0).then_some((r, n))
        })
        .collect();
    counts.sort_by(|(ra, a), (rb, b)| b.total_cmp(a).then(ra.cmp(rb)));
    counts
        .iter()
        .map(|(r, n)| format!("{r} {n}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// One workload × front run on a fresh fleet; `name` is the workload's name in the tables.
/// The fleet hit rate and the spread come from the pods' own counters, whoever sent the load.
#[allow(clippy::too_many_arguments)]
pub fn run_one(
    name: &'static str,
    driver: Driver<'_>,
    front: Front,
    pods: usize,
    costs: &SimCosts,
    cache_blocks: Option<usize>,
    tick: impl Fn() + Send + Sync,
) -> anyhow::Result<PolicyRun> {
    let policy = front.name();
    let dir = run_dir(&format!("bench-{name}-{}", policy.replace(' ', "-")));
    let mut args = costs.args();
    if let Some(n) = cache_blocks {
        args.extend(["--cache-blocks".to_owned(), n.to_string()]);
    }
    let arg_refs: Vec<&str> = args.iter().map(String::as_str).collect();
    let fleet = start_pods(pods, &arg_refs, &dir)?;
    let addrs: Vec<String> = fleet.iter().map(|p| p.addr.clone()).collect();
    let running = Running::start(front, &addrs, &dir)?;
    let cpu0 = cpu_seconds(running.pid());
    let (m, oracle_rate) = match driver {
        Driver::Replay {
            trace,
            arrivals,
            oracle,
        } => {
            let started = Instant::now();
            let outcomes = replay(
                &running.url(),
                trace,
                arrivals,
                Duration::from_secs(60),
                tick,
            )?;
            let duration_s = started.elapsed().as_secs_f64();
            let reasons = crate::reasons::summary(&outcomes);
            if !reasons.is_empty() {
                println!("   {name} / {policy}: {reasons}");
            }
            let _ = std::fs::write(
                dir.join("outcomes.json"),
                serde_json::to_vec(&outcomes).unwrap_or_default(),
            );
            (Measured::of_outcomes(&outcomes, duration_s), oracle)
        }
        Driver::InferencePerf(w) => {
            let s = inference_perf::run(w, &running.url(), &dir)?;
            (0..w.requests).for_each(|_| tick());
            (Measured::of_inference_perf(&s), Oracle::default())
        }
    };
    let cpu = cpu_seconds(running.pid()) - cpu0;
    let filter = match &running {
        Running::Envoy(e) => filter_times(e),
        Running::Peer(_) => FilterTimes::default(),
    };
    if let Running::Envoy(e) = &running {
        // the decisions by reason, whoever sent the load (inference-perf sees no headers)
        let decisions = decision_counts(e);
        if !decisions.is_empty() {
            println!("   {name} / {policy} decisions: {decisions}");
        }
    }

    let http = client();
    let metric = |name: &str| each_pod(&http, &addrs, name);
    let hits: f64 = metric("vllm:prefix_cache_hits_total").iter().sum();
    let queries: f64 = metric("vllm:prefix_cache_queries_total").iter().sum();
    let per_pod = metric("vllm:e2e_request_latency_seconds_count");
    let mean = per_pod.iter().sum::<f64>() / per_pod.len().max(1) as f64;
    let max = per_pod.iter().copied().fold(0.0, f64::max);
    let hit_rate = hits / queries.max(1.0);
    Ok(PolicyRun {
        run: 1,
        workload: name,
        policy,
        requests: m.requests,
        ok: m.ok,
        errors: m.requests - m.ok,
        ttft_p50_ms: m.ttft_ms[0],
        ttft_p90_ms: m.ttft_ms[1],
        ttft_p99_ms: m.ttft_ms[2],
        e2e_p50_ms: m.e2e_ms[0],
        e2e_p90_ms: m.e2e_ms[1],
        e2e_p99_ms: m.e2e_ms[2],
        duration_s: m.duration_s,
        requests_per_s: m.ok as f64 / m.duration_s,
        output_tokens_per_s: m.output_tokens / m.duration_s,
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
        front_cpu_s_per_1k: cpu / m.requests.max(1) as f64 * 1000.0,
        filter,
        ttfts: m.ttfts,
    })
}

/// Every workload × front; traces saved under `out`. Then each closed-loop run of
/// `saturate` per front, then each inference-perf workload of `external` per front.
#[allow(clippy::too_many_arguments)]
pub fn run_all(
    bundle: &ModelBundle,
    workloads: &[Workload],
    fronts: &[Front],
    params: &TraceParams,
    pods: usize,
    costs: &SimCosts,
    saturate: &[Saturation],
    external: &[IpWorkload],
    out: &Path,
) -> anyhow::Result<Vec<PolicyRun>> {
    let total = fronts.len()
        * (workloads.len() * params.requests
            + saturate.iter().map(|s| s.requests).sum::<usize>()
            + external.iter().map(|w| w.requests).sum::<usize>());
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
        for &f in fronts {
            bar.set_message(format!("{} / {}", w.name(), f.name()));
            let driver = Driver::Replay {
                trace: &trace,
                arrivals: Arrivals::Scheduled,
                oracle: o,
            };
            runs.push(run_one(w.name(), driver, f, pods, costs, None, || {
                bar.inc(1)
            })?);
        }
    }
    for s in saturate {
        let sat_params = TraceParams {
            tenants: s.tenants,
            requests: s.requests,
            context_words: s.context_words.unwrap_or(params.context_words),
            question_words: s.question_words.unwrap_or(params.question_words),
            ..*params
        };
        let trace = generate(Workload::SharedPrefix, &sat_params);
        write_jsonl(&out.join(format!("trace-{}.jsonl", s.name)), &trace)?;
        let o = oracle(bundle, &trace)?;
        for &f in fronts {
            bar.set_message(format!("{} / {}", s.name, f.name()));
            let driver = Driver::Replay {
                trace: &trace,
                arrivals: Arrivals::Saturated {
                    concurrency: s.concurrency,
                },
                oracle: o,
            };
            runs.push(run_one(
                s.name,
                driver,
                f,
                pods,
                costs,
                Some(s.cache_blocks),
                || bar.inc(1),
            )?);
        }
    }
    for w in external {
        for &f in fronts {
            bar.set_message(format!("{} / {} (inference-perf)", w.name, f.name()));
            let driver = Driver::InferencePerf(w);
            runs.push(run_one(
                w.name,
                driver,
                f,
                pods,
                costs,
                Some(w.cache_blocks),
                || bar.inc(1),
            )?);
        }
    }
    bar.finish_and_clear();
    Ok(runs)
}

/// One counter of every pod at `addrs`, in that order (0 where a pod does not answer).
pub(crate) fn each_pod(http: &reqwest::blocking::Client, addrs: &[String], name: &str) -> Vec<f64> {
    addrs
        .iter()
        .map(|a| pod_metric(http, a, name).unwrap_or(0.0))
        .collect()
}
