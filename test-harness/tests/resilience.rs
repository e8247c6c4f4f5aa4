//! Load-, health- and eviction-aware routing with real processes: pods die, restart, evict;
//! bursts spread; separate Envoys agree. Loops are bounded in count and time; 127.0.0.1 only.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};
use test_harness::cluster::{client, start_envoy, start_pod, PodKind};
use test_harness::fleet::{Answer, Fleet, ZERO_COST};
use test_harness::load::{in_flight_at, Load};

const POLL_MS: u64 = 200;

const RUNBOOK: &str = "You are the on-call assistant for the payments platform. Before answering, read the \
incident context carefully. Confirm the affected service, the region, the time the alert fired and the \
current error rate. Check the deployment history for changes in the last two hours and compare latency \
percentiles against the weekly baseline. If a rollback is possible and the change correlates with the \
incident, recommend it first. Escalate to the database team when replication lag exceeds thirty seconds. ";

fn prompt(tag: &str) -> Value {
    json!({"prompt": format!("{tag}: {RUNBOOK}{RUNBOOK}"), "max_tokens": 2})
}

fn fleet(name: &str, pod_args: &[&str]) -> Fleet {
    Fleet::start(name, 3, pod_args, |s| s.poll_interval_ms = POLL_MS).expect("fleet starts")
}

/// Concurrent open-loop load (requests always in flight, some on the pod that dies): a
/// kill -9 costs no request that had not started answering. Non-streaming answers start
/// only when complete, so Envoy retries every one caught by the kill on a fallback.
#[test]
fn a_pod_killed_under_concurrent_load_costs_no_request() {
    // ~40 ms per request: at 40 req/s, one or two are in flight at any moment
    let slow = [
        "--sim-ttft-base-ms",
        "30",
        "--sim-prefill-us-per-token",
        "20",
        "--sim-decode-ms-per-token",
        "5",
    ];
    let mut f = fleet("kill-under-load", &slow);
    f.wait_polled(&f.envoy).unwrap();
    let load = Load::start(f.envoy.url("/v1/completions"), 40.0, |i| {
        (prompt(&format!("group {}", i % 6)), false)
    });
    std::thread::sleep(Duration::from_secs(2));
    f.pods[0].proc.kill();
    let killed_at = load.now();
    std::thread::sleep(Duration::from_secs(3));
    let outcomes = load.finish();
    let failures: Vec<&String> = outcomes.iter().filter_map(|o| o.failure.as_ref()).collect();
    assert!(
        failures.is_empty(),
        "{} of {} failed: {failures:?}",
        failures.len(),
        outcomes.len()
    );
    assert!(
        outcomes.iter().filter(|o| o.sent_s > killed_at).count() > 60,
        "the load went on after the kill"
    );
    eprintln!(
        "{} requests, {} in flight at the kill, none failed",
        outcomes.len(),
        in_flight_at(&outcomes, killed_at)
    );
}

#[test]
fn killed_pod_is_avoided() {
    let mut f = fleet("kill", &ZERO_COST);
    let victim = 1;
    let victim_addr = f.pods[victim].addr.clone();
    // steady load of different prompts (one every ~10 ms), bounded in count and time;
    // kill -9 one pod after one second of it
    let start = Instant::now();
    let mut killed_at: Option<Instant> = None;
    let (mut before, mut after_kill, mut failed) = (0, 0, Vec::new());
    for i in 0..400 {
        if start.elapsed() > Duration::from_secs(4) {
            break;
        }
        if killed_at.is_none() && start.elapsed() > Duration::from_secs(1) {
            f.pods[victim].proc.kill();
            killed_at = Some(Instant::now());
        }
        let a = f.send("/v1/completions", &prompt(&format!("request {i}")), &[]);
        match killed_at {
            None => {
                assert_eq!(a.status, 200);
                before += 1;
            }
            Some(t) => {
                after_kill += 1;
                if a.status != 200 {
                    failed.push((i, t.elapsed(), a.status));
                    // Envoy's own reply (the pod is gone) is an OpenAI-style JSON error too
                    assert!(
                        a.body["error"]["message"].is_string(),
                        "request {i}: {} {}",
                        a.status,
                        a.body
                    );
                }
                if t.elapsed() > Duration::from_millis(POLL_MS * 3) {
                    assert_eq!(
                        a.status,
                        200,
                        "request {i} failed {:?} after the kill",
                        t.elapsed()
                    );
                    assert_ne!(
                        a.header("x-prefix-router-pod"),
                        victim_addr,
                        "routed to the dead pod"
                    );
                }
            }
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    println!("{before} requests before the kill, {after_kill} after; failed after the kill: {} {failed:?}", failed.len());
    assert!(after_kill > 50, "the load must go on well past the kill");
    // a sequential client has no request in flight at the kill; the ones the filter sends to
    // the dead pod before it learns are retried on a fallback by Envoy: none is lost
    assert!(failed.is_empty(), "{failed:?}");
    assert!(
        f.wait(Duration::from_secs(5), || f.pod_stat(
            &f.envoy,
            "healthy",
            &f.pods[victim].addr
        ) == 0.0),
        "the dead pod is reported down"
    );
}

/// Sends `body` as a streaming request; `(status, x-inference-pod, complete)` where complete
/// means the SSE stream ended with `[DONE]`.
fn send_streaming(f: &Fleet, body: &Value) -> (u16, String, bool) {
    let mut body = body.clone();
    body["stream"] = json!(true);
    let r = f
        .http
        .post(f.envoy.url("/v1/completions"))
        .json(&body)
        .send()
        .expect("request through envoy");
    let status = r.status().as_u16();
    let pod = r
        .headers()
        .get("x-inference-pod")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned();
    let text = r.bytes().unwrap_or_default();
    let events = test_harness::wire::sse_data(&text);
    (
        status,
        pod,
        events.last().map(String::as_str) == Some("[DONE]"),
    )
}

#[test]
fn a_dead_chosen_pod_costs_no_request() {
    // Polling off: nothing but the request path can tell the filter that the owner died, so
    // the first request after the kill is routed to the dead pod. Envoy must carry it, and
    // every later one, to a fallback before any response byte: no client sees a failure.
    let mut f = Fleet::start("dead-owner", 3, &ZERO_COST, |s| s.poll_interval_ms = 0)
        .expect("fleet starts");
    let body = prompt("dead owner");
    let owner = f.send("/v1/completions", &body, &[]);
    assert_eq!(owner.status, 200);
    let victim = f.pod_index(&owner.pod);
    let victim_addr = f.pods[victim].addr.clone();
    f.pods[victim].proc.kill();
    let again = f.send("/v1/completions", &body, &[]);
    assert_eq!(again.status, 200, "{}", again.body);
    assert_eq!(
        again.header("x-prefix-router-pod"),
        victim_addr,
        "the filter still chose the owner (it cannot know yet)"
    );
    assert_ne!(again.pod, owner.pod, "another pod answered");
    assert_eq!(f.stat(&f.envoy, "prefix_router_served_by_fallback"), 1.0);
    // streaming and not, the owner's prompt and new ones: every request is answered whole
    for i in 0..30 {
        let body = if i % 3 == 0 {
            prompt("dead owner")
        } else {
            prompt(&format!("after {i}"))
        };
        if i % 2 == 0 {
            let (status, pod, complete) = send_streaming(&f, &body);
            assert_eq!((status, complete), (200, true), "streaming request {i}");
            assert_ne!(pod, owner.pod);
        } else {
            let a = f.send("/v1/completions", &body, &[]);
            assert_eq!(a.status, 200, "request {i}: {}", a.body);
            assert_ne!(a.pod, owner.pod);
        }
    }
    // retries are bounded: with every pod dead, a request fails once the list and one
    // round-robin try are used up, with Envoy's JSON error, and Envoy answers at once after
    for p in f.pods.iter_mut() {
        p.proc.kill();
    }
    let dead = f.send("/v1/completions", &prompt("all dead"), &[]);
    assert_eq!(dead.status, 503, "{}", dead.body);
    assert!(dead.body["error"]["message"].is_string(), "{}", dead.body);
    let retries = f.stat(&f.envoy, "envoy_cluster_upstream_rq_retry");
    assert!(retries >= 1.0, "retries: {retries}");
}

#[test]
fn restarted_pod_loses_its_entries_then_reseeds() {
    let mut f = fleet("restart", &ZERO_COST);
    let body = prompt("restart scenario");
    let first = f.send("/v1/completions", &body, &[]);
    assert_eq!(first.reason(), "cold");
    let again = f.send("/v1/completions", &body, &[]);
    assert_eq!(
        (again.pod.as_str(), again.reason()),
        (first.pod.as_str(), "prefix-hit")
    );
    assert!(again.cached() > 0);

    // kill -9 and restart on the same address
    let i = f.pod_index(&first.pod);
    let port: u16 = f.pods[i].addr.rsplit(':').next().unwrap().parse().unwrap();
    f.pods[i].proc.kill();
    let generations = f.stat(&f.envoy, "prefix_router_pod_generation_changes");
    let dir = f.dir.clone();
    f.pods[i] = start_pod(
        PodKind::ModelServer,
        &first.pod,
        port,
        &ZERO_COST,
        &dir,
        &client(),
    )
    .unwrap();
    assert!(
        f.wait(Duration::from_secs(10), || {
            f.stat(&f.envoy, "prefix_router_pod_generation_changes") > generations
                && f.pod_stat(&f.envoy, "healthy", &f.pods[i].addr) == 1.0
        }),
        "the filter never noticed the restart: {}",
        f.http
            .get(f.envoy.admin_url("/stats/prometheus"))
            .send()
            .unwrap()
            .text()
            .unwrap()
            .lines()
            .filter(|l| l.starts_with("prefix_router"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    // the first request after the restart is a miss that re-seeds; later ones hit
    let after = f.send("/v1/completions", &body, &[]);
    assert_eq!(after.cached(), 0);
    assert_ne!(after.reason(), "prefix-hit", "old entries must be gone");
    let later = f.send("/v1/completions", &body, &[]);
    assert_eq!(later.pod, after.pod);
    assert_eq!(later.reason(), "prefix-hit");
    assert!(later.cached() > 0);
}

#[test]
fn evicted_blocks_make_the_next_request_cold() {
    // every pod can hold just one block
    let mut args = ZERO_COST.to_vec();
    args.extend(["--cache-blocks", "1"]);
    let f = fleet("evict", &args);
    let a = prompt("prompt A");
    let first = f.send("/v1/completions", &a, &[]);
    assert_eq!(first.status, 200);
    let owner = first.pod.clone();
    // send other prompts until one lands on the owner and evicts A's block
    let landed = (0..40).any(|k| {
        f.send(
            "/v1/completions",
            &prompt(&format!("other prompt {k}")),
            &[],
        )
        .pod == owner
    });
    assert!(landed, "no other prompt reached {owner}");
    // wait until the filter has applied every eviction the pods report
    let evicted = || -> f64 {
        f.pods
            .iter()
            .map(|p| {
                test_harness::cluster::pod_metric(
                    &f.http,
                    &p.addr,
                    "prefix_router:cache_blocks_evicted_total",
                )
                .unwrap()
            })
            .sum()
    };
    let total = evicted();
    assert!(total >= 1.0);
    assert!(
        f.wait(Duration::from_secs(10), || f
            .stat(&f.envoy, "prefix_router_events_blocks_removed")
            >= total),
        "the filter never learned of the evictions"
    );
    let again = f.send("/v1/completions", &a, &[]);
    assert_eq!(again.cached(), 0, "A's block was evicted");
    assert_eq!(
        again.reason(),
        "cold",
        "the filter must know A is gone, not send it as a hit"
    );
}

#[test]
fn burst_of_identical_prompts_is_spread() {
    let f = fleet(
        "burst",
        &[
            "--max-num-seqs",
            "2",
            "--sim-ttft-base-ms",
            "1",
            "--sim-prefill-us-per-token",
            "50",
            "--sim-decode-ms-per-token",
            "5",
        ],
    );
    let body = json!({"prompt": format!("burst: {RUNBOOK}{RUNBOOK}"), "max_tokens": 20});
    let seed = f.send("/v1/completions", &body, &[]);
    let owner = seed.pod.clone();
    let results: Vec<Answer> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..50)
            .map(|_| s.spawn(|| f.send("/v1/completions", &body, &[])))
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let mut per_pod: BTreeMap<String, usize> = BTreeMap::new();
    let mut reasons: BTreeMap<String, usize> = BTreeMap::new();
    let mut reused = 0;
    for r in &results {
        assert_eq!(r.status, 200, "{}", r.body);
        *per_pod.entry(r.pod.clone()).or_default() += 1;
        *reasons.entry(r.reason().to_owned()).or_default() += 1;
        reused += usize::from(r.cached() > 0);
    }
    println!(
        "50 concurrent identical prompts, first owner {owner}: per pod {per_pod:?}, \
         reasons {reasons:?}, {reused} reused the prefix"
    );
    assert!(
        per_pod.len() >= 2,
        "the imbalance guard should spread a burst: {per_pod:?}"
    );
    assert!(per_pod.get(&owner).copied().unwrap_or(0) < 50);
    // A pod that takes a spilled request computes the prefix and becomes an owner too, but
    // only once its answer starts (until then it holds nothing): decisions made while the
    // burst is routed see the seeded owner (`prefix-hit`) or spill (`imbalanced`), never a
    // cold prompt. What affinity must keep is that most of the burst lands where the prefix
    // is by the time the request is computed.
    let hits = reasons.get("prefix-hit").copied().unwrap_or(0);
    let spilled = reasons.get("imbalanced").copied().unwrap_or(0);
    assert!(
        hits > 0 && hits + spilled == results.len(),
        "the seeded owner is known, spills are imbalanced: {reasons:?}"
    );
    assert!(
        reused >= results.len() / 2,
        "affinity should keep most of the burst on pods that hold the prefix: \
         {reused}/{} reused",
        results.len()
    );
}

#[test]
fn separate_envoys_agree_and_learn_from_events() {
    // Envoy A routes round-robin (no affinity); Envoy B (prefix policy) never sees A's
    // decisions, only the pods' cache events.
    let f = Fleet::start("two-envoys", 3, &ZERO_COST, |s| {
        s.poll_interval_ms = POLL_MS
    })
    .unwrap();
    let b = start_envoy(
        "envoy-b",
        &f.addrs(),
        true,
        |s| s.poll_interval_ms = POLL_MS,
        &f.dir,
    )
    .unwrap();
    let a_rr = start_envoy(
        "envoy-a-rr",
        &f.addrs(),
        true,
        |s| {
            s.poll_interval_ms = POLL_MS;
            s.policy = "round_robin".into();
        },
        &f.dir,
    )
    .unwrap();
    f.wait_polled(&b).unwrap();
    f.wait_polled(&a_rr).unwrap();

    // the same cold prompt goes to the same pod through two independent prefix Envoys: C
    // polls nothing, so it cannot have learned the first placement; it agrees by rendezvous
    let c_blind = start_envoy(
        "envoy-c-blind",
        &f.addrs(),
        true,
        |s| s.poll_interval_ms = 0,
        &f.dir,
    )
    .unwrap();
    let cold = prompt("independent replicas");
    let via_main = f.send("/v1/completions", &cold, &[]);
    assert_eq!(via_main.reason(), "cold");
    let via_c = f.send_via(&c_blind, "/v1/completions", &cold, &[]);
    assert_eq!(
        via_c.reason(),
        "cold",
        "C has no shared state with the first Envoy"
    );
    assert_eq!(via_main.pod, via_c.pod, "independent replicas agree");

    // a prompt placed by the round-robin Envoy is learned by B from the pod's events. B has
    // polled since before the first request, so it has heard every block stored so far: the
    // cold prompt's (stored once, then hit) and the placed one's. Waiting for that total, not
    // for "more than before", keeps the cold prompt's late events from passing for these.
    let blocks = |body: &Value| {
        let n = f.tokenize(body)["block_hashes"]
            .as_array()
            .map_or(0, Vec::len);
        assert!(n > 0, "the prompt spans full blocks");
        n as f64
    };
    let placed_prompt = prompt("placed elsewhere");
    let expected = blocks(&cold) + blocks(&placed_prompt);
    let placed = f.send_via(&a_rr, "/v1/completions", &placed_prompt, &[]);
    assert_eq!(placed.reason(), "round-robin");
    assert!(
        f.wait(Duration::from_secs(10), || f
            .stat(&b, "prefix_router_events_blocks_stored")
            >= expected),
        "envoy B never received the pods' BlockStored events ({} of {expected})",
        f.stat(&b, "prefix_router_events_blocks_stored")
    );
    let learned = f.send_via(&b, "/v1/completions", &placed_prompt, &[]);
    assert_eq!(
        learned.reason(),
        "prefix-hit",
        "B must know the block from events"
    );
    assert_eq!(learned.pod, placed.pod);
    assert!(learned.cached() > 0);

    // pod health, in-flight, event lag and decisions are all exported
    for name in [
        "prefix_router_pod_healthy{pod=",
        "prefix_router_pod_inflight{pod=",
        "prefix_router_pod_event_lag_ms{pod=",
        "prefix_router_decisions{reason=\"prefix_hit\",model=",
        "prefix_router_polls_failed",
    ] {
        let text = f
            .http
            .get(b.admin_url("/stats/prometheus"))
            .send()
            .unwrap()
            .text()
            .unwrap();
        assert!(text.contains(name), "{name} missing from Envoy stats");
    }
    assert_eq!(f.pod_stat(&b, "healthy", &f.pods[0].addr), 1.0);
}
