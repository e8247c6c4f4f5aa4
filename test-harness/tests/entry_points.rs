//! Every inference entry point through a real Envoy, called with the clients users run: the
//! OpenAI Python client's Responses call and the Anthropic Python client's messages call
//! (whole and streamed) are rendered by the filter as the pod renders them, so a repeated
//! system prompt lands on the pod that holds it, across both APIs and chat completions
//! alike. Embeddings go to a pod (balanced, not 404 at Envoy); other paths stay closed.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use serde_json::{json, Value};
use std::process::Command;
use test_harness::fleet::{Fleet, ZERO_COST};
use test_harness::paths;

/// Calls the Envoy at argv[1] with both clients; one JSON line per call.
const CLIENTS: &str = r#"
import json, sys
import anthropic, openai
url, model, system, question = sys.argv[1:5]
oa = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0)
an = anthropic.Anthropic(base_url=url, api_key="none", max_retries=0)
def out(api, raw, text, cached):
    print(json.dumps({"api": api, "pod": raw.headers.get("x-inference-pod"),
        "reason": raw.headers.get("x-prefix-router-reason"), "text": text, "cached": cached}))
for _ in range(2):
    raw = oa.responses.with_raw_response.create(model=model, instructions=system, input=question, max_output_tokens=4)
    r = raw.parse()
    out("responses", raw, r.output_text, r.usage.input_tokens_details.cached_tokens)
    raw = an.messages.with_raw_response.create(model=model, max_tokens=4, system=system,
        messages=[{"role": "user", "content": question}])
    m = raw.parse()
    out("messages", raw, m.content[0].text, m.usage.cache_read_input_tokens)
events = [e.type for e in oa.responses.create(model=model, instructions=system, input=question, max_output_tokens=4, stream=True)]
assert events[0] == "response.created" and events[-1] == "response.completed", events
with an.messages.stream(model=model, max_tokens=4, system=system, messages=[{"role": "user", "content": question}]) as s:
    final = s.get_final_message()
print(json.dumps({"api": "streamed", "responses_events": len(events), "messages_stop": final.stop_reason,
    "messages_cached": final.usage.cache_read_input_tokens}))
"#;

#[test]
fn the_responses_and_messages_clients_are_routed_by_prefix() {
    let f = Fleet::start("entry-points", 3, &ZERO_COST, |_| {}).unwrap();
    let model = "SmolLM2-135M-Instruct";
    let system = "You are the on-call assistant for the payments platform. Confirm the service, \
        the region, the time the alert fired and the error rate; check deployments of the last \
        two hours; compare latency with the weekly baseline; recommend a rollback first when a \
        change correlates; escalate replication lag over thirty seconds to the database team. "
        .repeat(3);
    let question = "Checkout returns 502s in eu-west-1 since 09:14. What first?";
    let out = Command::new(paths::repo_root().join(".venv/bin/python"))
        .args(["-c", CLIENTS, &f.envoy.url(""), model, &system, question])
        .output()
        .expect(".venv/bin/python with openai and anthropic (scripts/setup.sh)");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "client calls failed:\n{stderr}");
    let calls: Vec<Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let (streamed, calls) = calls.split_last().unwrap();
    assert_eq!(calls.len(), 4, "{calls:?}");
    // one pod holds the system prompt; every call after the first finds it there
    let pod = &calls[0]["pod"];
    assert!(pod.is_string(), "{calls:?}");
    for c in calls {
        assert_eq!(&c["pod"], pod, "{calls:?}");
        assert!(
            c["text"].as_str().unwrap().starts_with("[simulated]"),
            "{c}"
        );
    }
    assert_eq!(calls[0]["reason"], "cold");
    for c in &calls[1..] {
        assert_eq!(c["reason"], "prefix-hit", "{calls:?}");
        assert!(c["cached"].as_u64().unwrap() >= 128, "{c}");
    }
    assert_eq!(streamed["messages_stop"], "max_tokens");
    assert!(
        streamed["messages_cached"].as_u64().unwrap() >= 128,
        "{streamed}"
    );
    // the same conversation as chat completions: the same prompt, the same pod
    let chat = json!({"model": model, "max_tokens": 2, "messages": [
        {"role": "system", "content": system}, {"role": "user", "content": question}]});
    let a = f.send("/v1/chat/completions", &chat, &[]);
    assert_eq!((a.status, a.reason()), (200, "prefix-hit"), "{}", a.body);
    assert_eq!(Some(a.pod.as_str()), pod.as_str());

    // embeddings reach a pod (this server has none: its own 404), not Envoy's closed door
    let e = f.send(
        "/v1/embeddings",
        &json!({"model": model, "input": "x"}),
        &[],
    );
    assert_eq!(e.status, 404);
    assert!(!e.pod.is_empty(), "answered by a pod: {}", e.body);
    let closed = f.send("/tokenize", &json!({"prompt": "x"}), &[]);
    assert!(closed.status == 404 && closed.pod.is_empty());
}
