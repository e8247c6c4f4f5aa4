//! The filter in a real Envoy (`--concurrency 2`) in front of three real model-server
//! processes, all on 127.0.0.1.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use serde_json::json;
use std::collections::{BTreeMap, BTreeSet};
use test_harness::fleet::{Answer, Fleet, ZERO_COST};

fn fleet(name: &str) -> Fleet {
    Fleet::start(name, 3, &ZERO_COST, |s| s.max_body_bytes = 256 * 1024).expect("fleet starts")
}

fn header<'a>(a: &'a Answer, name: &str) -> &'a str {
    a.header(name)
}

fn cached(a: &Answer) -> u64 {
    a.cached()
}

fn answer(r: reqwest::blocking::Response) -> Answer {
    Answer::read(r)
}

/// The runbook lead-in shared by the tests (`test-data/runbook.txt`).
const RUNBOOK: &str = include_str!("../../test-data/runbook.txt");

#[test]
fn repeated_prompt_sticks_to_one_pod_and_hits() {
    let f = fleet("sticky");
    assert_eq!(f.hits(), vec![0.0; 3]);
    let body = json!({"prompt": format!("{RUNBOOK}{RUNBOOK}Incident: checkout returns 502 in eu-west-1."), "max_tokens": 8});
    let answers: Vec<Answer> = (0..6)
        .map(|_| f.send("/v1/completions", &body, &[]))
        .collect();
    let first = &answers[0];
    assert_eq!(first.status, 200, "{}", first.body);
    assert!(
        first.body["usage"]["prompt_tokens"].as_u64().unwrap() > 128,
        "prompt must exceed one block"
    );
    assert_eq!(cached(first), 0, "the first send seeds the cache");
    assert_eq!(header(first, "x-prefix-router-reason"), "cold");
    for a in &answers[1..] {
        assert_eq!(
            a.pod, first.pod,
            "every repeat answered by the pod holding the prefix"
        );
        assert!(cached(a) > 0);
        assert_eq!(cached(a), cached(&answers[1]));
        assert_eq!(header(a, "x-prefix-router-reason"), "prefix-hit");
    }
    let owner = f.pod_index(&first.pod);
    let hits = f.hits();
    for (i, h) in hits.iter().enumerate() {
        if i == owner {
            assert_eq!(
                *h,
                5.0 * cached(&answers[1]) as f64,
                "owner's hits = 5 repeats × cached tokens"
            );
        } else {
            assert_eq!(*h, 0.0, "other pods never hit: {hits:?}");
        }
    }

    // A prompt shorter than one block never hits, wherever it goes.
    let short = json!({"prompt": "Summarise the incident in one line.", "max_tokens": 3});
    for _ in 0..6 {
        let a = f.send("/v1/completions", &short, &[]);
        assert_eq!(a.status, 200);
        assert_eq!(cached(&a), 0);
        assert_eq!(header(&a, "x-prefix-router-reason"), "short-prompt");
    }
    assert_eq!(f.hits(), hits, "short prompts add no hits");

    // Streaming passes through Envoy, and still lands on the owner.
    let mut stream = body.clone();
    stream["stream"] = json!(true);
    let r = f
        .http
        .post(f.envoy.url("/v1/completions"))
        .json(&stream)
        .send()
        .unwrap();
    assert_eq!(r.headers()["x-inference-pod"].to_str().unwrap(), first.pod);
    let datas = test_harness::wire::sse_data(&r.bytes().unwrap());
    assert_eq!(datas.len(), 8 + 2, "8 tokens, final chunk, [DONE]");
    assert_eq!(*datas.last().unwrap(), "[DONE]");

    // The filter's decisions are visible in Envoy's Prometheus stats.
    let stats = f
        .http
        .get(f.envoy.admin_url("/stats/prometheus"))
        .send()
        .unwrap()
        .text()
        .unwrap();
    let stat = |n: &str| {
        test_harness::cluster::metric_value(&stats, n).unwrap_or_else(|| panic!("{n} missing"))
    };
    assert_eq!(stat("prefix_router_decisions{reason=\"cold\"}"), 1.0);
    assert_eq!(stat("prefix_router_decisions{reason=\"prefix_hit\"}"), 6.0);
    assert_eq!(
        stat("prefix_router_decisions{reason=\"short_prompt\"}"),
        6.0
    );
    assert_eq!(stat("prefix_router_decisions{reason=\"fallback\"}"), 0.0);
    let blocks = first.body["usage"]["prompt_tokens"].as_u64().unwrap() / 128;
    assert_eq!(
        stat("prefix_router_table_entries"),
        blocks as f64,
        "one prompt's blocks, one owner each"
    );
    assert_eq!(
        stat("prefix_router_matched_blocks"),
        6.0 * blocks as f64,
        "5 repeats + 1 stream"
    );
}

/// As deployed (no debug headers), a new prompt is tokenized only as deep as a pod owns it —
/// its first block — and its repeats still go to the pod that computed it, and hit there.
#[test]
fn without_debug_headers_a_new_prompt_is_hashed_one_block_deep_and_repeats_still_hit() {
    let f = Fleet::start("lazy", 3, &ZERO_COST, |s| {
        s.max_body_bytes = 256 * 1024;
        s.debug_headers = false;
    })
    .expect("fleet starts");
    let body = json!({"prompt": format!("{}Incident: disk full on db-3.", RUNBOOK.repeat(8)), "max_tokens": 1});
    let first = f.send("/v1/completions", &body, &[]);
    assert_eq!(first.status, 200, "{}", first.body);
    let tokens = first.body["usage"]["prompt_tokens"].as_u64().unwrap();
    assert!(tokens > 6 * 128, "{tokens} tokens");
    assert_eq!(
        header(&first, "x-prefix-router-reason"),
        "",
        "no debug headers"
    );
    assert_eq!(f.stat(&f.envoy, "prefix_router_hashed_blocks"), 1.0);
    for _ in 0..5 {
        let a = f.send("/v1/completions", &body, &[]);
        assert_eq!(a.status, 200, "{}", a.body);
        assert_eq!(a.pod, first.pod, "a repeat goes where the prefix is");
        assert!(
            cached(&a) >= 6 * 128,
            "the pod reuses every full block: {}",
            cached(&a)
        );
    }
    let owner = f.pod_index(&first.pod);
    for (i, h) in f.hits().iter().enumerate() {
        assert_eq!(*h > 0.0, i == owner, "pod {i}: {h} hits");
    }
}

#[test]
fn envoy_that_lost_its_port_is_started_again_on_a_fresh_one() {
    // another process holds the port Envoy is first given, as one that took it between the
    // harness's pick and Envoy's bind would (the filter's compile makes that window seconds)
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let f = Fleet::start("lost-port", 1, &ZERO_COST, |s| s.listen_port = port)
        .expect("started again on a fresh port");
    assert_ne!(f.envoy.listen_port, port);
    let body = json!({"prompt": "Hello there", "max_tokens": 2});
    let a = f.send("/v1/completions", &body, &[]);
    assert_eq!(a.status, 200, "{}", a.body);
}

#[test]
fn different_prompts_spread_without_reuse() {
    let f = fleet("spread");
    let mut per_pod: BTreeMap<String, usize> = BTreeMap::new();
    for i in 0..30 {
        // each prompt differs from its very first token
        let body = json!({"prompt": format!("Ticket {i} ({}): {RUNBOOK}{RUNBOOK}", i * 7919), "max_tokens": 2});
        let a = f.send("/v1/completions", &body, &[]);
        assert_eq!(a.status, 200, "{}", a.body);
        assert_eq!(cached(&a), 0, "prompt {i} must not reuse anything");
        assert_eq!(header(&a, "x-prefix-router-reason"), "cold");
        *per_pod.entry(a.pod).or_default() += 1;
    }
    assert_eq!(
        per_pod.len(),
        3,
        "30 cold prompts should reach every pod: {per_pod:?}"
    );
    assert_eq!(f.hits(), vec![0.0; 3]);
}

#[test]
fn filter_and_server_hash_identically() {
    let f = fleet("hashes");
    let bodies = [
        (
            "/v1/completions",
            json!({"prompt": format!("{RUNBOOK}{RUNBOOK}"), "max_tokens": 1}),
        ),
        (
            "/v1/completions",
            json!({"prompt": format!("{RUNBOOK}{RUNBOOK}"), "cache_salt": "tenant-a", "max_tokens": 1}),
        ),
        (
            "/v1/chat/completions",
            json!({"messages": [
            {"role": "system", "content": RUNBOOK},
            {"role": "user", "content": format!("{RUNBOOK} Digits 0123456789 and ünïcödé 🚀.")},
        ], "max_tokens": 1}),
        ),
    ];
    let mut seen = BTreeSet::new();
    for (path, body) in bodies {
        let a = f.send(path, &body, &[]);
        assert_eq!(a.status, 200, "{}", a.body);
        let filter_hash = header(&a, "x-prefix-router-prefix-hash").to_owned();
        assert_eq!(
            json!(filter_hash),
            f.pod_prefix_hash(&body),
            "{path}: filter and server disagree"
        );
        assert!(
            seen.insert(filter_hash),
            "salt and chat must give distinct prefixes"
        );
    }
}

#[test]
fn a_destination_outside_the_cluster_is_never_reached() {
    // The filter is told of three pods, but Envoy's `pods` cluster has only the first two, as
    // if the filter's list were stale or broken. Whatever it writes, Envoy connects only to
    // members: requests it sends to the third are served by a fallback member.
    let f = Fleet::start("outsider", 3, &ZERO_COST, |s| {
        s.members = Some(s.pods[..2].to_vec());
    })
    .expect("fleet starts");
    let outsider = &f.pods[2];
    let mut chosen_outsider = 0;
    for i in 0..30 {
        let a = f.send(
            "/v1/completions",
            &json!({"prompt": format!("{i} {RUNBOOK}"), "max_tokens": 1}),
            &[],
        );
        assert_eq!(a.status, 200, "{}", a.body);
        assert_ne!(a.pod, outsider.name, "request {i} reached a non-member");
        if header(&a, "x-prefix-router-pod") == outsider.addr {
            chosen_outsider += 1;
        }
    }
    assert!(chosen_outsider > 0, "the filter never chose the outsider");
    let served =
        test_harness::cluster::pod_metric(&f.http, &outsider.addr, "vllm:prompt_tokens_total")
            .unwrap();
    assert_eq!(served, 0.0, "the outsider served requests");
}

#[test]
fn client_destination_header_is_never_honoured() {
    let f = fleet("spoof");
    let body = json!({"prompt": format!("{RUNBOOK}{RUNBOOK}"), "max_tokens": 1});
    let owner = f.send("/v1/completions", &body, &[]).pod;
    for target in f.pods.iter().filter(|p| p.name != owner) {
        let a = f.send(
            "/v1/completions",
            &body,
            &[("x-gateway-destination-endpoint", target.addr.as_str())],
        );
        assert_eq!(
            a.pod, owner,
            "spoofed header toward {} was honoured",
            target.name
        );
    }
    // short prompts and other paths: the filter's choice wins too
    for target in &f.pods {
        let spoof = [("x-gateway-destination-endpoint", target.addr.as_str())];
        let a = f.send(
            "/v1/completions",
            &json!({"prompt": "hi", "max_tokens": 1}),
            &spoof,
        );
        assert_eq!(
            header(&a, "x-prefix-router-pod"),
            f.pods[f.pod_index(&a.pod)].addr
        );
        let r = f
            .http
            .get(f.envoy.url("/v1/models"))
            .header(spoof[0].0, spoof[0].1)
            .send()
            .unwrap();
        let a = answer(r);
        assert_eq!(a.status, 200);
        assert_eq!(
            header(&a, "x-prefix-router-pod"),
            f.pods[f.pod_index(&a.pod)].addr
        );
    }
}

#[test]
fn bad_input_gets_4xx_json_and_envoy_keeps_serving() {
    let f = fleet("badinput");
    let cases: Vec<(&str, Vec<u8>, u16)> = vec![
        ("/v1/completions", b"{not json".to_vec(), 400),
        ("/v1/completions", b"\xff\xfe\x00garbage".to_vec(), 400),
        ("/v1/completions", br#"{"max_tokens":3}"#.to_vec(), 400),
        ("/v1/completions", br#"{"prompt":""}"#.to_vec(), 400),
        ("/v1/completions", br#"{"prompt":7}"#.to_vec(), 400),
        ("/v1/chat/completions", br#"{"messages":[]}"#.to_vec(), 400),
        (
            "/v1/chat/completions",
            br#"{"messages":[{"role":"user"}]}"#.to_vec(),
            400,
        ),
        (
            "/v1/completions",
            br#"{"model":"gpt-4","prompt":"hi"}"#.to_vec(),
            404,
        ),
        (
            "/v1/completions",
            json!({"prompt": "x".repeat(300 * 1024)})
                .to_string()
                .into_bytes(),
            413,
        ),
        ("/v1/completions", Vec::new(), 400),
    ];
    for (path, body, want) in cases {
        let shown: String = String::from_utf8_lossy(&body).chars().take(40).collect();
        let r = f
            .http
            .post(f.envoy.url(path))
            .header("content-type", "application/json")
            .body(body)
            .send()
            .unwrap();
        let a = answer(r);
        assert_eq!(a.status, want, "{path} {shown:?}: {}", a.body);
        assert!(
            a.body["error"]["message"].is_string(),
            "{shown:?}: {}",
            a.body
        );
        assert!(a.body["error"]["type"].is_string());
    }
    // the wrong method on an inference path: passed through, answered 405 in JSON
    for path in ["/v1/completions", "/v1/chat/completions"] {
        let a = answer(f.http.get(f.envoy.url(path)).send().unwrap());
        assert_eq!(a.status, 405, "{path}: {}", a.body);
        assert_eq!(a.body["error"]["code"], "method_not_allowed");
    }
    // a body the filter accepts but the server rejects (too long for the model) is the server's 400
    let a = f.send(
        "/v1/completions",
        &json!({"prompt": "word ".repeat(9000)}),
        &[],
    );
    assert_eq!(a.status, 400, "{}", a.body);
    assert_eq!(a.body["error"]["code"], "context_length_exceeded");
    // still serving
    let a = f.send(
        "/v1/completions",
        &json!({"prompt": "still here?", "max_tokens": 1}),
        &[],
    );
    assert_eq!(a.status, 200);
}

#[test]
fn bad_plugin_configuration_fails_envoy_load_naming_the_field() {
    use test_harness::envoy_config::{render, render_unchecked, EnvoySettings};
    use test_harness::paths;
    let dir = test_harness::cluster::run_dir("badcfg");
    std::fs::create_dir_all(&dir).unwrap();
    let mut s = EnvoySettings::new(
        test_harness::process::free_port().unwrap(),
        test_harness::process::free_port().unwrap(),
        vec!["127.0.0.1:1".into()],
        Some(paths::wasm_path()),
    );
    s.tokenizer_dir = Some(paths::default_model_dir());
    s.table_capacity = 0;
    let refused = render(&s).unwrap_err();
    assert!(
        refused.to_string().contains("'table_capacity'"),
        "{refused}"
    );
    let yaml = render_unchecked(&s).unwrap();
    assert!(
        yaml.contains(r#"\"table_capacity\":0"#),
        "the bad value is in the config"
    );
    let path = dir.join("bad.yaml");
    std::fs::write(&path, yaml).unwrap();
    let log_path = dir.join("envoy.log");
    let mut envoy = std::process::Command::new(paths::envoy_bin())
        .args(["--disable-hot-restart", "--concurrency", "1", "--log-path"])
        .arg(&log_path)
        .arg("-c")
        .arg(&path)
        .spawn()
        .unwrap();
    // Envoy must exit by itself; one that accepted the configuration would keep running.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let status = loop {
        if let Some(status) = envoy.try_wait().unwrap() {
            break status;
        }
        if std::time::Instant::now() > deadline {
            let _ = envoy.kill();
            let _ = envoy.wait();
            panic!("Envoy accepted a bad plugin configuration (still running after 60 s)");
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    assert!(
        !status.success(),
        "Envoy must refuse a bad plugin configuration"
    );
    let log = std::fs::read_to_string(&log_path).unwrap();
    assert!(
        log.contains("field 'table_capacity'"),
        "error should name the field:\n{log}"
    );
}

/// The chat shapes vLLM accepts go through the filter: rendered and hashed exactly as the pod
/// does (equal to its `/tokenize`), the same image sent twice lands where it was computed,
/// and what the filter cannot render (SmolLM2's template cannot add a null content) or a
/// batch it only routes on its first prompt is forwarded for the pod to answer, never
/// rejected by the filter.
#[test]
fn vllm_chat_shapes_are_forwarded_and_hashed_like_the_pod() {
    let f = fleet("chat-shapes");
    let image = |url: &str| {
        json!({"messages": [{"role": "user", "content": [
            {"type": "text", "text": RUNBOOK},
            {"type": "image_url", "image_url": {"url": url}},
            {"type": "text", "text": "What does the graph show?"}]}], "max_tokens": 1})
    };
    let tools = json!({"messages": [
            {"role": "system", "content": RUNBOOK},
            {"role": "user", "content": "Is checkout healthy?"},
            {"role": "tool", "tool_call_id": "c1", "content": "{\"errors\": 0}"}],
        "tools": [{"type": "function", "function": {"name": "status", "parameters": {}}}],
        "chat_template_kwargs": {"enable_thinking": false}, "max_tokens": 1});
    for body in [image("https://example.com/a.png"), tools.clone()] {
        let a = f.send("/v1/chat/completions", &body, &[]);
        assert_eq!(a.status, 200, "{}", a.body);
        assert_eq!(
            json!(header(&a, "x-prefix-router-prefix-hash")),
            f.pod_prefix_hash(&body),
            "{body}"
        );
    }
    // the same image again: a hit where it was computed; another image: its own prefix
    let first = f.send(
        "/v1/chat/completions",
        &image("https://example.com/a.png"),
        &[],
    );
    assert_eq!(first.reason(), "prefix-hit");
    let other = f.send(
        "/v1/chat/completions",
        &image("https://example.com/b.png"),
        &[],
    );
    assert_ne!(
        header(&other, "x-prefix-router-prefix-hash"),
        header(&first, "x-prefix-router-prefix-hash")
    );
    // not renderable here (content null added to a string in SmolLM2's template): forwarded
    // by load, and the pod answers (it rejects it too: both render alike)
    let mut calls = tools.clone();
    calls["messages"].as_array_mut().unwrap().insert(
        2,
        json!({"role": "assistant", "content": null, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "status", "arguments": "{}"}}]}),
    );
    let a = f.send("/v1/chat/completions", &calls, &[]);
    assert_eq!(header(&a, "x-prefix-router-reason"), "fallback");
    assert!(!a.pod.is_empty(), "a pod answered: {}", a.body);
    assert_eq!(a.status, 400, "{}", a.body);
    // a batch: routed on its first prompt, forwarded, answered by the pod
    let batch = json!({"prompt": [format!("{RUNBOOK}{RUNBOOK}"), "second"], "max_tokens": 1});
    let a = f.send("/v1/completions", &batch, &[]);
    assert_ne!(header(&a, "x-prefix-router-reason"), "fallback");
    assert_eq!(a.status, 200, "{}", a.body);
    assert_eq!(
        a.body["choices"].as_array().unwrap().len(),
        2,
        "one choice per prompt"
    );
}

/// LoRA adapters served on top of the model: routed in the same pool, each adapter's prompt
/// sticks to its own pod with hashes equal to the pod's, and no adapter shares a prefix with
/// the base model or another adapter; an adapter nobody serves is the filter's 404.
#[test]
fn lora_adapters_route_apart_from_the_base_model() {
    let f = Fleet::start(
        "lora",
        3,
        &[&ZERO_COST[..], &["--lora-adapters", "sql-lora,chat-lora"]].concat(),
        |s| s.adapters = vec!["sql-lora".into(), "chat-lora".into()],
    )
    .expect("fleet starts");
    let body = |model: &str| json!({"model": model, "prompt": format!("{RUNBOOK}{RUNBOOK}"), "max_tokens": 1});
    let mut prefixes = BTreeSet::new();
    for model in ["SmolLM2-135M-Instruct", "sql-lora", "chat-lora"] {
        let first = f.send("/v1/completions", &body(model), &[]);
        assert_eq!(first.status, 200, "{model}: {}", first.body);
        assert_eq!(
            first.reason(),
            "cold",
            "{model}: nothing shared with the others"
        );
        assert_eq!(
            json!(header(&first, "x-prefix-router-prefix-hash")),
            f.pod_prefix_hash(&body(model)),
            "{model}"
        );
        prefixes.insert(header(&first, "x-prefix-router-prefix-hash").to_owned());
        let again = f.send("/v1/completions", &body(model), &[]);
        assert_eq!(
            (again.reason(), again.pod.as_str()),
            ("prefix-hit", first.pod.as_str())
        );
        assert!(cached(&again) > 0, "{model}");
    }
    assert_eq!(prefixes.len(), 3);
    // decisions are counted by the model each request named, adapters included
    for model in ["sql-lora", "chat-lora"] {
        let name = format!("prefix_router_decisions{{model=\"{model}\"}}");
        assert_eq!(f.stat(&f.envoy, &name), 2.0, "{model}");
    }
    let unknown = f.send("/v1/completions", &body("other-lora"), &[]);
    assert_eq!(unknown.status, 404, "{}", unknown.body);
    assert!(unknown.pod.is_empty(), "answered by the filter");
}
