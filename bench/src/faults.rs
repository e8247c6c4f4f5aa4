//! `scripts/bench.sh faults`: what pod failures and churn cost, through a real Envoy with the
//! filter, under a steady open-loop load of shared-prefix traffic (a quarter of it streamed).
//! Figures are printed and written (`faults.json`), never asserted; the real-process tests
//! assert the behaviour (no failed request across a kill, join/leave), not these timings.
//!
//! Phases, in one run on one fleet (sim pods, members from a watched EDS file):
//! 1. kill -9 a pod under load: requests failed, and how many were in flight at the kill;
//! 2. restart it on the same address: time until the filter drops its ownership (a new
//!    generation) and until it serves prefix hits again;
//! 3. add a pod (EDS): time until it serves a request;
//! 4. many unique prompts: Envoy's RSS before and after (the ownership table is bounded);
//! 5. a soak with a pod killed every period and restarted: requests lost, RSS start/end.

use crate::overhead::rss_mb;
use serde::Serialize;
use serde_json::{json, Value};
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use test_harness::cluster::{client, pod_metric, run_dir, start_envoy_unvalidated, start_pod};
use test_harness::cluster::{start_pods, PodKind};
use test_harness::envoy_config::{write_eds, Membership};
use test_harness::fleet::Fleet;
use test_harness::load::{in_flight_at, Load, Outcome};

/// Sim costs: a request takes tens of milliseconds, so some are always in flight.
const POD_ARGS: [&str; 8] = [
    "--sim-ttft-base-ms",
    "15",
    "--sim-prefill-us-per-token",
    "40",
    "--sim-decode-ms-per-token",
    "8",
    "--max-num-seqs",
    "16",
];

#[derive(Debug, Clone, Serialize)]
pub struct FaultParams {
    pub rate: f64,
    pub pods: usize,
    pub unique_prompts: usize,
    pub soak_s: u64,
    pub kill_every_s: u64,
    pub poll_interval_ms: u64,
}

const LEAD: &str = "You are the support assistant of a hosting company. Answer with the \
steps to diagnose the customer's problem, the commands to run, what each output means, and \
when to escalate to the on-call engineer; keep a friendly tone and never promise refunds. ";

fn body(i: usize) -> (Value, bool) {
    // four in five: one of eight shared leads (groups), two blocks long, then a unique
    // question; one in five: a prompt of its own (cold, placed by rendezvous over all pods)
    let group = i % 8;
    let stream = i.is_multiple_of(4);
    let prompt = if i % 5 == 4 {
        format!("[ticket {i}] {LEAD}{LEAD}{LEAD}")
    } else {
        format!("[team {group}] {LEAD}{LEAD}{LEAD} Question {i}: why is my site slow?")
    };
    (
        json!({"prompt": prompt, "max_tokens": 4, "stream": stream}),
        stream,
    )
}

/// Seconds until `cond` holds (polled every 20 ms), up to `limit`.
fn time_until(limit: Duration, mut cond: impl FnMut() -> bool) -> Option<f64> {
    let t = Instant::now();
    while t.elapsed() < limit {
        if cond() {
            return Some(t.elapsed().as_secs_f64());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    None
}

#[derive(Debug, Serialize)]
pub struct FaultReport {
    pub params: FaultParams,
    pub kill_requests_in_window: usize,
    pub kill_failed: usize,
    /// failures after a 200 answer had begun (nothing can retry those)
    pub kill_failed_streams_started: usize,
    pub kill_in_flight_at_kill: usize,
    pub kill_failures: Vec<String>,
    pub restart_ownership_dropped_s: Option<f64>,
    /// until the restarted pod answers a request again
    pub restart_serves_again_s: Option<f64>,
    /// prefix-hit share of the decisions in the 5 s after the restart
    pub restart_hit_share_after: f64,
    pub join_first_request_s: Option<f64>,
    pub unique_prompts_sent: usize,
    pub unique_req_per_s: f64,
    pub unique_failed: usize,
    pub unique_rss_before_mb: f64,
    pub unique_rss_after_mb: f64,
    pub unique_table_entries: f64,
    pub soak_s: f64,
    pub soak_requests: usize,
    pub soak_kills: usize,
    pub soak_failed: usize,
    /// the first few failures, as the client saw them
    pub soak_failures: Vec<String>,
    pub soak_rss_start_mb: f64,
    pub soak_rss_end_mb: f64,
}

pub fn run(p: &FaultParams, out: &Path) -> anyhow::Result<FaultReport> {
    let dir = run_dir("bench-faults");
    // one spare pod, not a member until the join phase
    let pods = start_pods(p.pods + 1, &POD_ARGS, &dir)?;
    let addrs: Vec<String> = pods.iter().map(|x| x.addr.clone()).collect();
    let eds = dir.join("eds").join("pods.yaml");
    std::fs::create_dir_all(dir.join("eds"))?;
    write_eds(&eds, &addrs[..p.pods])?;
    let envoy = start_envoy_unvalidated(
        "envoy",
        &addrs,
        true,
        |s| {
            s.membership = Membership::EdsFile(eds.clone());
            s.poll_interval_ms = p.poll_interval_ms;
            s.debug_headers = false;
        },
        &dir,
    )?;
    let mut f = Fleet::of(pods, envoy, dir.clone());
    let members = |f: &Fleet, n: usize| {
        f.wait(Duration::from_secs(20), || {
            f.stat(&f.envoy, "prefix_router_members") == n as f64
        })
    };
    anyhow::ensure!(members(&f, p.pods), "the filter never saw the members");
    let url = f.envoy.url("/v1/completions");
    let envoy_pid = f.envoy.proc.pid();

    // 1. kill -9 under load
    println!("   1. kill -9 a pod at {} req/s", p.rate);
    let load = Load::start(url.clone(), p.rate, body);
    std::thread::sleep(Duration::from_secs(5));
    let victim = 0;
    let kill_at = load.now();
    f.pods[victim].proc.kill();
    std::thread::sleep(Duration::from_secs(5));
    let end_kill = load.now();

    // 2. restart it on the same address
    println!("   2. restart it");
    let generations = f.stat(&f.envoy, "prefix_router_pod_generation_changes");
    let port: u16 = addrs[victim].rsplit(':').next().unwrap_or("0").parse()?;
    let name = f.pods[victim].name.clone();
    f.pods[victim] = start_pod(PodKind::ModelServer, &name, port, &POD_ARGS, &dir, &f.http)?;
    let restarted = Instant::now();
    // the answer that shows the new process drops what was recorded for the old one (the
    // per-pod gauges follow at the next tick)
    let dropped = time_until(Duration::from_secs(20), || {
        f.stat(&f.envoy, "prefix_router_pod_generation_changes") > generations
    })
    .map(|_| restarted.elapsed().as_secs_f64());
    let decisions = |f: &Fleet| {
        (
            f.stat(&f.envoy, "prefix_router_decisions{reason=\"prefix_hit\"}"),
            f.stat(&f.envoy, "prefix_router_decisions"),
        )
    };
    let (hit0, all0) = decisions(&f);
    let serves = time_until(Duration::from_secs(30), || {
        pod_metric(
            &f.http,
            &addrs[victim],
            "vllm:e2e_request_latency_seconds_count",
        )
        .unwrap_or(0.0)
            > 0.0
    })
    .map(|_| restarted.elapsed().as_secs_f64());
    std::thread::sleep(Duration::from_secs(5).saturating_sub(restarted.elapsed()));
    let (hit1, all1) = decisions(&f);
    let hit_share = (hit1 - hit0) / (all1 - all0).max(1.0);

    // 3. a pod joins
    println!("   3. add a pod");
    let spare = &addrs[p.pods];
    write_eds(&eds, &addrs)?;
    let written = Instant::now();
    let joined = time_until(Duration::from_secs(30), || {
        pod_metric(&f.http, spare, "vllm:e2e_request_latency_seconds_count").unwrap_or(0.0) > 0.0
    })
    .map(|_| written.elapsed().as_secs_f64());
    let outcomes = load.finish();
    let window: Vec<&Outcome> = outcomes
        .iter()
        .filter(|o| o.sent_s >= kill_at - 1.0 && o.sent_s < end_kill)
        .collect();
    let kill_failed: Vec<&Outcome> = window
        .iter()
        .copied()
        .filter(|o| o.failure.is_some())
        .collect();
    let in_flight = in_flight_at(&outcomes, kill_at);

    // 4. unique prompts: is Envoy's memory bounded?
    println!("   4. {} unique prompts", p.unique_prompts);
    let rss_before = rss_mb(envoy_pid);
    let unique_start = Instant::now();
    let next = Arc::new(AtomicUsize::new(0));
    let unique_failed = Arc::new(AtomicUsize::new(0));
    let threads: Vec<_> = (0..8)
        .map(|_| {
            let (next, failed, url, n) = (
                Arc::clone(&next),
                Arc::clone(&unique_failed),
                url.clone(),
                p.unique_prompts,
            );
            std::thread::spawn(move || {
                let http = client();
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= n {
                        break;
                    }
                    // one block of its own (≈ 180 tokens): one new table entry each
                    let prompt = format!("{i:08} unique {LEAD}{LEAD}{LEAD}");
                    let ok = http
                        .post(&url)
                        .json(&json!({"prompt": prompt, "max_tokens": 1}))
                        .send()
                        .is_ok_and(|r| r.status() == 200);
                    if !ok {
                        failed.fetch_add(1, Ordering::Relaxed);
                    }
                }
            })
        })
        .collect();
    for t in threads {
        let _ = t.join();
    }
    let unique_rate = p.unique_prompts as f64 / unique_start.elapsed().as_secs_f64();
    let rss_after = rss_mb(envoy_pid);
    let entries = f.stat(&f.envoy, "prefix_router_table_entries");

    // 5. soak: a pod killed every period, restarted 5 s later
    println!(
        "   5. soak: {} s, a pod killed every {} s",
        p.soak_s, p.kill_every_s
    );
    let soak_rss_start = rss_mb(envoy_pid);
    let load = Load::start(url, p.rate, body);
    let soak_start = Instant::now();
    let mut kills = 0;
    while soak_start.elapsed() < Duration::from_secs(p.soak_s) {
        let until_next = Duration::from_secs(p.kill_every_s)
            .saturating_sub(Duration::from_secs(5))
            .min(Duration::from_secs(p.soak_s).saturating_sub(soak_start.elapsed()));
        std::thread::sleep(until_next);
        if soak_start.elapsed() + Duration::from_secs(5) > Duration::from_secs(p.soak_s) {
            break;
        }
        let i = kills % (p.pods + 1);
        f.pods[i].proc.kill();
        kills += 1;
        std::thread::sleep(Duration::from_secs(5));
        let port: u16 = addrs[i].rsplit(':').next().unwrap_or("0").parse()?;
        let name = f.pods[i].name.clone();
        f.pods[i] = start_pod(PodKind::ModelServer, &name, port, &POD_ARGS, &dir, &f.http)?;
    }
    let soak = load.finish();
    let soak_rss_end = rss_mb(envoy_pid);

    let report = FaultReport {
        params: p.clone(),
        kill_requests_in_window: window.len(),
        kill_failed: kill_failed.len(),
        kill_failed_streams_started: kill_failed.iter().filter(|o| o.started).count(),
        kill_in_flight_at_kill: in_flight,
        kill_failures: kill_failed
            .iter()
            .filter_map(|o| o.failure.clone())
            .take(10)
            .collect(),
        restart_ownership_dropped_s: dropped,
        restart_serves_again_s: serves,
        restart_hit_share_after: hit_share,
        join_first_request_s: joined,
        unique_prompts_sent: p.unique_prompts,
        unique_req_per_s: unique_rate,
        unique_failed: unique_failed.load(Ordering::Relaxed),
        unique_rss_before_mb: rss_before,
        unique_rss_after_mb: rss_after,
        unique_table_entries: entries,
        soak_s: soak_start.elapsed().as_secs_f64(),
        soak_requests: soak.len(),
        soak_kills: kills,
        soak_failed: soak.iter().filter(|o| o.failure.is_some()).count(),
        soak_failures: soak
            .iter()
            .filter_map(|o| {
                o.failure
                    .as_ref()
                    .map(|f| format!("{f} (stream: {})", o.stream))
            })
            .take(10)
            .collect(),
        soak_rss_start_mb: soak_rss_start,
        soak_rss_end_mb: soak_rss_end,
    };
    crate::write_json(out, "faults", &report)?;
    Ok(report)
}

/// The printed table.
pub fn table(r: &FaultReport) -> String {
    let secs = |v: Option<f64>| v.map_or("never (limit)".to_owned(), |s| format!("{:.2} s", s));
    let poll = r.params.poll_interval_ms as f64 / 1000.0;
    let mut t = String::new();
    t += "   | fault | figure |\n   |---|---|\n";
    t += &format!(
        "   | kill -9 a pod at {} req/s | {} failed of {} sent from 1 s before to 5 s after ({} in flight at the kill, {} of the failures had already started answering) |\n",
        r.params.rate, r.kill_failed, r.kill_requests_in_window, r.kill_in_flight_at_kill, r.kill_failed_streams_started
    );
    t += &format!(
        "   | restart it | ownership dropped after {} (poll {poll:.1} s); serves again after {}; prefix-hit share of decisions in the next 5 s {:.2} |\n",
        secs(r.restart_ownership_dropped_s),
        secs(r.restart_serves_again_s),
        r.restart_hit_share_after
    );
    t += &format!(
        "   | add a pod (EDS) | first request served after {} |\n",
        secs(r.join_first_request_s)
    );
    t += &format!(
        "   | {} unique prompts ({:.0} req/s) | Envoy RSS {:.0} MB → {:.0} MB; table entries {:.0}; {} failed |\n",
        r.unique_prompts_sent, r.unique_req_per_s, r.unique_rss_before_mb, r.unique_rss_after_mb, r.unique_table_entries, r.unique_failed
    );
    t += &format!(
        "   | soak {:.0} s, {} kills | {} lost of {}; Envoy RSS {:.0} MB → {:.0} MB |\n",
        r.soak_s,
        r.soak_kills,
        r.soak_failed,
        r.soak_requests,
        r.soak_rss_start_mb,
        r.soak_rss_end_mb
    );
    t
}
