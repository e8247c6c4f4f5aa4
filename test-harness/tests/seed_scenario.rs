//! The reference scenario end to end, verified through a real Prometheus's HTTP API: three
//! pods, Envoy with the filter, Prometheus scraping every second.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;
use test_harness::cluster::{client, pod_metric, run_dir, start_envoy, start_pods};
use test_harness::prometheus::Prometheus;

const HITS_BY_POD: &str = "sum by (pod) (vllm:prefix_cache_hits_total)";
const QUERIES_TOTAL: &str = "sum(vllm:prefix_cache_queries_total)";

/// The seed scenario's runbook lead-in (longer than one 128-token block).
const RUNBOOK: &str = include_str!("../../test-data/incident-runbook.txt");

#[test]
fn seed_demo_through_prometheus() {
    let dir = run_dir("seed");
    let pods = start_pods(
        3,
        &[
            "--sim-ttft-base-ms",
            "1",
            "--sim-prefill-us-per-token",
            "20",
            "--sim-decode-ms-per-token",
            "0",
        ],
        &dir,
    )
    .unwrap();
    let addrs: Vec<String> = pods.iter().map(|p| p.addr.clone()).collect();
    let envoy = start_envoy("envoy", &addrs, true, |_| {}, &dir).unwrap();
    let prom = Prometheus::start(&addrs, Some(envoy.admin_port), &dir).unwrap();
    let http = client();
    let wait = Duration::from_secs(30);

    // Before: every pod scraped, every hit counter 0.
    let before = prom.wait_for(HITS_BY_POD, wait, |s| s.len() == 3).unwrap();
    assert!(before.iter().all(|(_, v)| *v == 0.0), "{before:?}");

    // Six sends of the runbook prompt through Envoy.
    let body = json!({"prompt": format!("{RUNBOOK}\nAlert: checkout-api 5xx rate 12% in eu-west-1."), "max_tokens": 8});
    let mut cached = Vec::new();
    let mut answered = BTreeSet::new();
    for _ in 0..6 {
        let r = http
            .post(envoy.url("/v1/completions"))
            .json(&body)
            .send()
            .unwrap();
        answered.insert(r.headers()["x-inference-pod"].to_str().unwrap().to_owned());
        let v: Value = r.json().unwrap();
        cached.push(
            v["usage"]["prompt_tokens_details"]["cached_tokens"]
                .as_u64()
                .unwrap(),
        );
        assert!(
            v["usage"]["prompt_tokens"].as_u64().unwrap() > 128,
            "the prompt must exceed one block"
        );
    }
    assert_eq!(answered.len(), 1, "one pod answered all six: {answered:?}");
    assert_eq!(
        cached[0], 0,
        "the first send is a miss that seeds the cache"
    );
    let per_hit = cached[1];
    assert!(
        per_hit >= 128 && cached[1..].iter().all(|&c| c == per_hit),
        "{cached:?}"
    );
    let expected = 5.0 * per_hit as f64;

    // After: Prometheus (polled until it scraped the new values) shows one pod up by 5 × cached.
    let after = prom
        .wait_for(HITS_BY_POD, wait, |s| {
            s.iter().map(|(_, v)| v).sum::<f64>() == expected
        })
        .unwrap();
    let by_pod: BTreeMap<String, f64> = after
        .into_iter()
        .map(|(l, v)| (l["pod"].clone(), v))
        .collect();
    let owner = answered.into_iter().next().unwrap();
    for (pod, v) in &by_pod {
        if *pod == owner {
            assert_eq!(*v, expected);
        } else {
            assert_eq!(*v, 0.0, "{by_pod:?}");
        }
    }

    // Short prompt ×6: queries rise in Prometheus, hits do not.
    let queries_before = prom.query(QUERIES_TOTAL).unwrap()[0].1;
    let short = json!({"prompt": "Is the checkout API healthy right now?", "max_tokens": 2});
    let mut short_queries = 0.0;
    for _ in 0..6 {
        let v: Value = http
            .post(envoy.url("/v1/completions"))
            .json(&short)
            .send()
            .unwrap()
            .json()
            .unwrap();
        short_queries += v["usage"]["prompt_tokens"].as_f64().unwrap();
    }
    prom.wait_for(QUERIES_TOTAL, wait, |s| {
        s.first()
            .is_some_and(|x| x.1 == queries_before + short_queries)
    })
    .unwrap();
    assert_eq!(
        prom.by_label(HITS_BY_POD, "pod").unwrap(),
        by_pod,
        "short prompts never hit"
    );

    // Thirty different prompts: no reuse anywhere, several pods used.
    let requests_before = prom
        .by_label(
            "sum by (pod) (vllm:e2e_request_latency_seconds_count)",
            "pod",
        )
        .unwrap();
    for i in 0..30 {
        let body = json!({"prompt": format!("Case {i}-{}: {RUNBOOK}{RUNBOOK}", i * 104_729), "max_tokens": 2});
        let v: Value = http
            .post(envoy.url("/v1/completions"))
            .json(&body)
            .send()
            .unwrap()
            .json()
            .unwrap();
        assert_eq!(v["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    }
    let total_before: f64 = requests_before.values().sum();
    let requests_after = prom
        .wait_for(
            "sum by (pod) (vllm:e2e_request_latency_seconds_count)",
            wait,
            |s| s.iter().map(|x| x.1).sum::<f64>() == total_before + 30.0,
        )
        .unwrap();
    let used = requests_after
        .iter()
        .filter(|(l, v)| *v > requests_before.get(&l["pod"]).copied().unwrap_or(0.0))
        .count();
    assert!(
        used > 1,
        "30 different prompts should use more than one pod"
    );
    assert_eq!(
        prom.by_label(HITS_BY_POD, "pod").unwrap(),
        by_pod,
        "different prompts never hit"
    );

    // Prometheus agrees with the pods' own /metrics.
    for p in &pods {
        assert_eq!(
            pod_metric(&http, &p.addr, "vllm:prefix_cache_hits_total").unwrap(),
            by_pod[&p.name]
        );
    }
    // And it scrapes the filter's decisions from Envoy.
    // (1 cold runbook send + 30 cold different prompts)
    prom.wait_for("sum(prefix_router_decisions{reason=\"cold\"})", wait, |s| {
        s.first().is_some_and(|x| x.1 == 31.0)
    })
    .unwrap();
}
