//! A fleet of llama.cpp's `llama-server` (a real third-party inference server, serving the
//! same SmolLM2 GGUF) behind Envoy and the filter: the reference scenario read back through a
//! real Prometheus, different prompts spreading, a killed server avoided and a restarted one
//! treated as cold.
//!
//! These pods have no cache-events endpoint: the filter follows them through `/health` and
//! `/metrics` and keeps its own records of which blocks it sent where. Which pod served a
//! request is read from the pods' own counters (`llama-server` sets no pod header), and the
//! filter's choice from its debug header.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use prefix_core::protocol::defaults::MODEL_NAME;
use prefix_core::protocol::headers::debug;
use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;
use test_harness::cluster::{client, pod_metric, start_pod, PodKind};
use test_harness::fleet::{Answer, Fleet};
use test_harness::prometheus::Prometheus;

const POLL_MS: u64 = 200;

/// Prompt tokens a server reused from its cache, per server (`instance` = its address).
const CACHED_BY_POD: &str = "sum by (instance) (llamacpp:prompt_tokens_cached_total)";
/// Prompt tokens a server computed (not reused): rises on every server that served a request.
const COMPUTED: &str = "llamacpp:prompt_tokens_total";

/// The seed scenario's runbook lead-in (longer than one 128-token block).
const RUNBOOK: &str = include_str!("../../test-data/incident-runbook.txt");

fn runbook_prompt() -> String {
    format!("{RUNBOOK}\nAlert: checkout-api 5xx rate 12% in eu-west-1.")
}

fn fleet(name: &str) -> Fleet {
    Fleet::start_of(PodKind::LlamaCpp, name, 3, &[], |s| {
        s.poll_interval_ms = POLL_MS
    })
    .expect("a fleet of llama-server pods behind Envoy starts")
}

/// `/v1/completions` through Envoy; must succeed.
fn complete(f: &Fleet, prompt: &str, max_tokens: u32) -> Answer {
    let body = json!({"model": MODEL_NAME, "prompt": prompt, "max_tokens": max_tokens});
    let a = f.send("/v1/completions", &body, &[]);
    assert_eq!(a.status, 200, "{}", a.body);
    a
}

/// The pod the filter chose.
fn chosen(a: &Answer) -> String {
    let pod = a.header(debug::POD);
    assert!(!pod.is_empty(), "no {} header", debug::POD);
    pod.to_owned()
}

/// Every pod's `llamacpp:prompt_tokens_total`, by address.
fn computed(f: &Fleet) -> BTreeMap<String, f64> {
    f.pods
        .iter()
        .map(|p| {
            (
                p.addr.clone(),
                pod_metric(&f.http, &p.addr, COMPUTED).unwrap(),
            )
        })
        .collect()
}

/// The pods whose counter rose between two readings.
fn risen(before: &BTreeMap<String, f64>, after: &BTreeMap<String, f64>) -> BTreeSet<String> {
    after
        .iter()
        .filter(|(pod, v)| **v > before.get(*pod).copied().unwrap_or(0.0))
        .map(|(pod, _)| pod.clone())
        .collect()
}

#[test]
fn seed_scenario_on_llama_server_pods() {
    let f = fleet("llama-seed");
    let prom = Prometheus::start(&f.addrs(), Some(f.envoy.admin_port), &f.dir).unwrap();
    let wait = Duration::from_secs(30);

    // Before: every server scraped, every cached-token counter 0.
    let before = prom
        .wait_for(CACHED_BY_POD, wait, |s| s.len() == 3)
        .unwrap();
    assert!(before.iter().all(|(_, v)| *v == 0.0), "{before:?}");

    // Six sends of the runbook prompt: one server answers all; sends 2-6 reuse its cache.
    let counters_before = computed(&f);
    let prompt = runbook_prompt();
    let (mut picked, mut cached, mut reasons) = (BTreeSet::new(), Vec::new(), Vec::new());
    for _ in 0..6 {
        let a = complete(&f, &prompt, 4);
        assert!(a.body["usage"]["prompt_tokens"].as_u64().unwrap() > 128);
        picked.insert(chosen(&a));
        cached.push(a.cached());
        reasons.push(a.reason().to_owned());
    }
    assert_eq!(picked.len(), 1, "the filter chose one server: {picked:?}");
    let owner = picked.into_iter().next().unwrap();
    assert_eq!(
        risen(&counters_before, &computed(&f)),
        BTreeSet::from([owner.clone()]),
        "only the chosen server computed anything"
    );
    assert_eq!(cached[0], 0, "the first send seeds: {cached:?}");
    assert!(cached[1..].iter().all(|&c| c >= 128), "{cached:?}");
    assert_eq!(reasons[0], "cold");
    assert!(
        reasons[1..].iter().all(|r| r == "prefix-hit"),
        "{reasons:?}"
    );

    // After: Prometheus shows the owner's counter up by exactly what the answers reported.
    let expected: f64 = cached.iter().sum::<u64>() as f64;
    let after = prom
        .wait_for(CACHED_BY_POD, wait, |s| {
            s.iter().map(|(_, v)| v).sum::<f64>() == expected
        })
        .unwrap();
    for (labels, v) in &after {
        let want = if labels["instance"] == owner {
            expected
        } else {
            0.0
        };
        assert_eq!(*v, want, "{after:?}");
    }

    // Thirty different prompts: no block reused anywhere, spread over several servers.
    let counters_before = computed(&f);
    let mut spread = BTreeSet::new();
    for i in 0..30 {
        let a = complete(
            &f,
            &format!("Case {i}-{}: {}", i * 104_729, runbook_prompt()),
            1,
        );
        // llama.cpp reuses any common leading tokens, but never a whole 128-token block here
        assert!(a.cached() < 128, "prompt {i} reused {}", a.cached());
        assert_eq!(a.reason(), "cold", "prompt {i}");
        spread.insert(chosen(&a));
    }
    assert!(
        spread.len() > 1,
        "30 different prompts all went to {spread:?}"
    );
    assert_eq!(
        risen(&counters_before, &computed(&f)),
        spread,
        "the servers the filter chose are the ones that computed"
    );
}

#[test]
fn a_killed_llama_server_is_avoided_and_a_restarted_one_is_cold() {
    let mut f = fleet("llama-restart");
    let prompt = runbook_prompt();
    let seed = complete(&f, &prompt, 2);
    let owner = chosen(&seed);
    let hit = complete(&f, &prompt, 2);
    assert_eq!((chosen(&hit), hit.reason()), (owner.clone(), "prefix-hit"));
    assert!(hit.cached() >= 128);

    // kill -9 the owner: no request fails, and the filter stops choosing it within a poll
    let i = f.pods.iter().position(|p| p.addr == owner).unwrap();
    f.pods[i].proc.kill();
    let _ = complete(&f, "Right after the kill: is the fleet healthy?", 1);
    assert!(
        f.wait(Duration::from_secs(10), || f
            .pod_stat(&f.envoy, "healthy", &owner)
            == 0.0),
        "the filter never marked the killed server down"
    );
    for k in 0..6 {
        let a = complete(
            &f,
            &format!("While {owner} is down, case {k}: {RUNBOOK}"),
            1,
        );
        assert_ne!(chosen(&a), owner, "case {k} was sent to the dead server");
    }

    // restart it on the same address: the filter sees its counters start again from zero,
    // drops what it recorded for it, and routes the runbook as a cold prompt
    let generations = f.stat(&f.envoy, "prefix_router_pod_generation_changes");
    let port: u16 = owner.rsplit(':').next().unwrap().parse().unwrap();
    let (name, dir) = (f.pods[i].name.clone(), f.dir.clone());
    f.pods[i] = start_pod(PodKind::LlamaCpp, &name, port, &[], &dir, &client()).unwrap();
    assert!(
        f.wait(Duration::from_secs(10), || {
            f.pod_stat(&f.envoy, "healthy", &owner) == 1.0
                && f.stat(&f.envoy, "prefix_router_pod_generation_changes") > generations
        }),
        "the filter never noticed the restart"
    );
    let after = complete(&f, &prompt, 2);
    assert_eq!(
        after.reason(),
        "cold",
        "the restarted server's records must be gone"
    );
    assert_eq!(after.cached(), 0);
    let again = complete(&f, &prompt, 2);
    assert_eq!(
        (chosen(&again), again.reason()),
        (chosen(&after), "prefix-hit")
    );
    assert!(again.cached() >= 128, "{}", again.body);
}

/// The chat endpoint: the filter renders SmolLM2's template as llama-server does, so a
/// conversation that grows turn by turn keeps landing where its earlier turns are cached.
#[test]
fn a_growing_chat_stays_on_one_llama_server() {
    let f = fleet("llama-chat");
    let mut messages = vec![json!({"role": "system", "content": RUNBOOK})];
    let mut picked = BTreeSet::new();
    let mut cached = Vec::new();
    for turn in 0..4 {
        messages.push(
            json!({"role": "user", "content": format!("Turn {turn}: what is the next step?")}),
        );
        let body = json!({"model": MODEL_NAME, "messages": messages, "max_tokens": 8});
        let a = f.send("/v1/chat/completions", &body, &[]);
        assert_eq!(a.status, 200, "{}", a.body);
        picked.insert(chosen(&a));
        cached.push(a.cached());
        let reply: &Value = &a.body["choices"][0]["message"];
        messages
            .push(json!({"role": "assistant", "content": reply["content"].as_str().unwrap_or("")}));
    }
    assert_eq!(picked.len(), 1, "{picked:?}");
    assert_eq!(cached[0], 0);
    assert!(cached[1..].iter().all(|&c| c >= 128), "{cached:?}");
}
