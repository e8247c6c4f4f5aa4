//! Several models behind one Envoy, through the real proxy: SmolLM2 (the built-in tokenizer)
//! on two pods and Qwen2.5 (its tokenizer and chat template fetched from files Envoy serves,
//! another block size, a LoRA adapter) on two others. Each model's requests land in its own
//! pool and stick there by prefix with the pods' own hashes; a pod that dies is replaced by
//! another of the same model's pool; an unknown model is the filter's 404; the model list
//! names every model.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use serde_json::{json, Value};
use std::time::Duration;
use test_harness::cluster::{client, run_dir, start_envoy, start_pod, PodKind};
use test_harness::envoy_config::ExtraModel;
use test_harness::fleet::{Fleet, ZERO_COST};
use test_harness::paths;
use test_harness::process::free_port;

const RUNBOOK: &str = include_str!("../../test-data/runbook.txt");
const SMOL: &str = "SmolLM2-135M-Instruct";
const QWEN: &str = "Qwen2.5-0.5B-Instruct";
const QWEN_LORA: &str = "qwen-sql";

/// The model list as Envoy answers it.
fn models_through(f: &Fleet) -> Value {
    f.http
        .get(f.envoy.url("/v1/models"))
        .send()
        .unwrap()
        .json()
        .unwrap()
}

fn chat(model: Option<&str>, question: &str) -> Value {
    let mut body = json!({"messages": [
        {"role": "system", "content": RUNBOOK},
        {"role": "user", "content": question},
    ], "max_tokens": 1});
    if let Some(m) = model {
        body["model"] = json!(m);
    }
    body
}

/// Two SmolLM2 pods (`smol-*`), two Qwen2.5 pods (`qwen-*`, block size 16, one adapter), one
/// Envoy routing both.
fn fleet() -> Fleet {
    let dir = run_dir("several-models");
    let qwen_dir =
        prefix_core::protocol::defaults::data_dir(&paths::repo_root()).join("tokenizers/qwen2.5");
    let http = client();
    let qwen_args = [
        &ZERO_COST[..],
        &[
            "--tokenizer",
            qwen_dir.to_str().unwrap(),
            "--served-model-name",
            QWEN,
            "--block-size",
            "16",
            "--lora-adapters",
            QWEN_LORA,
        ],
    ]
    .concat();
    let mut pods = Vec::new();
    for (name, args) in [
        ("smol-0", &ZERO_COST[..]),
        ("smol-1", &ZERO_COST[..]),
        ("qwen-0", &qwen_args[..]),
        ("qwen-1", &qwen_args[..]),
    ] {
        let port = free_port().unwrap();
        pods.push(start_pod(PodKind::ModelServer, name, port, args, &dir, &http).unwrap());
    }
    let addrs: Vec<String> = pods.iter().map(|p| p.addr.clone()).collect();
    let assets = free_port().unwrap();
    let envoy = start_envoy(
        "envoy",
        &addrs[..2],
        true,
        |s| {
            s.poll_interval_ms = 200;
            s.assets_port = assets;
            s.more_models = vec![ExtraModel {
                model_name: QWEN.into(),
                pods: addrs[2..].to_vec(),
                tokenizer_dir: Some(qwen_dir),
                block_size: Some(16),
                adapters: vec![QWEN_LORA.into()],
                aliases: Vec::new(),
            }];
        },
        &dir,
    )
    .unwrap();
    let f = Fleet::of(pods, envoy, dir);
    f.wait_polled(&f.envoy).unwrap();
    f
}

/// What the pod at `addr` says of a request body: the hash of its last full block.
fn pod_prefix_hash(f: &Fleet, addr: &str, body: &Value) -> Value {
    let t: Value = f
        .http
        .post(format!("http://{addr}/tokenize"))
        .json(body)
        .send()
        .and_then(|r| r.json())
        .unwrap();
    t["block_hashes"]
        .as_array()
        .unwrap()
        .last()
        .unwrap()
        .clone()
}

#[test]
fn each_model_sticks_by_prefix_in_its_own_pool() {
    let mut f = fleet();
    // the Qwen tokenizer is fetched by every worker VM at start; until then, by load
    let fetched = f.wait(Duration::from_secs(20), || {
        (0..4).all(|i| {
            let a = f.send(
                "/v1/chat/completions",
                &chat(Some(QWEN), &format!("warm-up {i}")),
                &[],
            );
            a.status == 200 && a.reason() != "fallback"
        })
    });
    assert!(fetched, "the Qwen tokenizer never loaded");

    for (model, pool) in [
        (Some(SMOL), "smol-"),
        (None, "smol-"),
        (Some(QWEN), "qwen-"),
        (Some(QWEN_LORA), "qwen-"),
    ] {
        let body = chat(
            model,
            "The checkout API returns 502s in eu-west-1. Where do I start?",
        );
        let first = f.send("/v1/chat/completions", &body, &[]);
        assert_eq!(first.status, 200, "{model:?}: {}", first.body);
        assert!(
            first.pod.starts_with(pool),
            "{model:?} went to {}",
            first.pod
        );
        let addr = &f.pods[f.pod_index(&first.pod)].addr;
        // the filter's hash of the prompt is the pod's own (its tokenizer, template, block size)
        assert_eq!(
            json!(first.header("x-prefix-router-prefix-hash")),
            pod_prefix_hash(&f, addr, &body),
            "{model:?}"
        );
        let again = f.send("/v1/chat/completions", &body, &[]);
        assert_eq!(
            (again.reason(), again.pod.as_str()),
            ("prefix-hit", first.pod.as_str()),
            "{model:?}"
        );
        assert!(again.cached() > 0, "{model:?}: {}", again.body);
    }
    // a client cannot pick the pool or the pod: both headers are replaced
    let qwen0 = f.pods[2].addr.clone();
    for _ in 0..4 {
        let a = f.send(
            "/v1/completions",
            &json!({"model": SMOL, "prompt": RUNBOOK, "max_tokens": 1}),
            &[
                ("x-prefix-router-cluster", "pods_1"),
                ("x-gateway-destination-endpoint", &qwen0),
            ],
        );
        assert_eq!(a.status, 200, "{}", a.body);
        assert!(a.pod.starts_with("smol-"), "{}", a.pod);
    }
    // a model nobody serves is the filter's 404, naming what is served
    let a = f.send(
        "/v1/chat/completions",
        &chat(Some("Llama-3.2-1B"), "hi"),
        &[],
    );
    assert_eq!((a.status, a.pod.as_str()), (404, ""), "{}", a.body);
    assert_eq!(a.header("content-type"), "application/json");
    assert_eq!(a.body["error"]["code"], "model_not_found", "{}", a.body);
    assert!(a.body["error"]["message"].as_str().unwrap().contains(QWEN));
    // the model list names every model and adapter
    let list = models_through(&f);
    let ids: Vec<&str> = list["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, [SMOL, QWEN, QWEN_LORA]);
    // each model's gauges and decisions carry its name
    assert_eq!(
        f.stat(
            &f.envoy,
            &format!("prefix_router_members{{model=\"{QWEN}\"}}")
        ),
        2.0
    );
    assert!(
        f.stat(
            &f.envoy,
            &format!("prefix_router_decisions{{model=\"{QWEN}\"}}")
        ) >= 2.0
    );

    // the Qwen pod holding the prefix dies: its requests go to the other Qwen pod, never to
    // a SmolLM2 pod (which would answer 404 for a model it does not serve)
    let body = chat(Some(QWEN), "Who do I page for the payments database?");
    let first = f.send("/v1/chat/completions", &body, &[]);
    let dead = f.pod_index(&first.pod);
    f.pods[dead].proc.kill();
    for i in 0..6 {
        let a = f.send(
            "/v1/chat/completions",
            &chat(Some(QWEN), &format!("Who do I page? {i}")),
            &[],
        );
        assert_eq!(a.status, 200, "{}", a.body);
        assert!(
            a.pod.starts_with("qwen-") && a.pod != first.pod,
            "{}",
            a.pod
        );
    }
    // the whole pool gone: Envoy's own reply, an OpenAI-style JSON error, never another pool
    let other = f.pod_index(if first.pod == "qwen-0" {
        "qwen-1"
    } else {
        "qwen-0"
    });
    f.pods[other].proc.kill();
    let a = f.send("/v1/chat/completions", &chat(Some(QWEN), "anyone?"), &[]);
    assert_eq!((a.status, a.pod.as_str()), (503, ""), "{}", a.body);
    assert_eq!(a.body["error"]["type"], "envoy_error", "{}", a.body);
    let smol = f.send(
        "/v1/chat/completions",
        &chat(Some(SMOL), "still here?"),
        &[],
    );
    assert_eq!(smol.status, 200, "{}", smol.body);
}

/// A model served under two names (vLLM's several `--served-model-name`s): a prompt sent under
/// one name and then the other lands on the same pod and reuses its blocks.
#[test]
fn a_model_served_under_two_names_shares_its_blocks() {
    let mut pod_args = test_harness::fleet::ZERO_COST.to_vec();
    pod_args.extend(["--served-model-aliases", "smol"]);
    let f = test_harness::fleet::Fleet::start("model-aliases", 3, &pod_args, |s| {
        s.aliases = vec!["smol".into()];
    })
    .unwrap();
    let lead = "Before paging anyone, check the dashboards, the last deploy and the error budget. ";
    let body = |model: &str| serde_json::json!({"model": model, "prompt": lead.repeat(30), "max_tokens": 1});
    let first = f.send("/v1/completions", &body("smol"), &[]);
    assert_eq!(first.status, 200, "{}", first.body);
    let again = f.send(
        "/v1/completions",
        &body(prefix_core::protocol::defaults::MODEL_NAME),
        &[],
    );
    assert_eq!(again.status, 200, "{}", again.body);
    assert_eq!(
        (again.reason(), again.pod.as_str()),
        ("prefix-hit", first.pod.as_str())
    );
    assert!(again.cached() > 0);
    let models = models_through(&f);
    assert!(models.to_string().contains("\"smol\""), "{models}");
}
