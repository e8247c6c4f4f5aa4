//! The model server over real HTTP on 127.0.0.1 (port 0): prefix-cache behaviour, metrics,
//! OpenAI shapes, streaming, bad input and graceful shutdown.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use clap::Parser;
use model_server::{run, Config};
use serde_json::{json, Value};
use std::time::Duration;

mod common;

use common::{start_with, Server};

/// A sim server that answers at once.
async fn start(extra: &[&str]) -> Server {
    let mut flags = vec!["--pod-name", "pod-test"];
    flags.extend(model_server::config::SIM_ZERO_COST);
    flags.extend_from_slice(extra);
    start_with(&flags).await
}

const RUNBOOK: &str = "You are the on-call assistant for the payments platform. Before answering, \
read the incident context carefully. Always confirm the affected service, the region, the time \
the alert fired and the current error rate. Check the deployment history for changes in the last \
two hours, and compare latency percentiles against the weekly baseline. If a rollback is \
possible and the change correlates with the incident, recommend it first. Escalate to the \
database team when replication lag exceeds thirty seconds. Never restart stateful services \
without a snapshot. Summarise findings as: impact, probable cause, next action, owner. ";

/// A completions body of roughly 2.5 blocks (between 2 and 3 full blocks).
async fn prompt_of_2_5_blocks(s: &Server) -> (Value, usize) {
    let text = format!("{RUNBOOK}{RUNBOOK}Context: the checkout service in eu-west-1 started returning HTTP 502 errors at 09:14 UTC, shortly after a change to the connection pool size. Question: what should I check first?");
    let body = json!({"prompt": text, "max_tokens": 4});
    let n = s.token_count(&body).await;
    assert!(
        (257..384).contains(&n),
        "test prompt should be 2-3 blocks, has {n} tokens"
    );
    (body, n)
}

#[tokio::test]
async fn short_prompt_never_hits() {
    let s = start(&[]).await;
    let body = json!({"prompt": "Short prompt, well under one block.", "max_tokens": 3});
    assert_eq!(s.cached("/v1/completions", &body).await, 0);
    assert_eq!(s.cached("/v1/completions", &body).await, 0);
    assert_eq!(s.metric("vllm:prefix_cache_hits_total").await, 0.0);
    assert!(s.metric("vllm:prefix_cache_queries_total").await > 0.0);
    s.shutdown().await;
}

#[tokio::test]
async fn repeated_prompt_hits_full_blocks_and_counts_tokens() {
    let s = start(&[]).await;
    let (body, n) = prompt_of_2_5_blocks(&s).await;
    assert_eq!(s.cached("/v1/completions", &body).await, 0);
    assert_eq!(s.metric("vllm:prefix_cache_hits_total").await, 0.0);
    assert_eq!(s.cached("/v1/completions", &body).await, 256);
    assert_eq!(s.metric("vllm:prefix_cache_hits_total").await, 256.0);
    assert_eq!(
        s.metric("vllm:prefix_cache_queries_total").await,
        2.0 * n as f64
    );
    assert_eq!(
        s.metric("prefix_router:cache_blocks_stored_total").await,
        2.0
    );

    // a prompt that shares only the first block reuses exactly 128 tokens
    let (_, v, _) = s.post("/tokenize", &body).await;
    let mut ids: Vec<u64> = v["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_u64().unwrap())
        .collect();
    for t in ids.iter_mut().skip(128) {
        *t = (*t + 1) % 49000 + 3;
    }
    let partial = json!({"prompt": ids, "max_tokens": 2});
    assert_eq!(s.cached("/v1/completions", &partial).await, 128);
    assert_eq!(s.metric("vllm:prefix_cache_hits_total").await, 384.0);
    s.shutdown().await;
}

#[tokio::test]
async fn cache_salt_isolates_tenants() {
    let s = start(&[]).await;
    let (mut body, _) = prompt_of_2_5_blocks(&s).await;
    body["cache_salt"] = json!("tenant-a");
    assert_eq!(s.cached("/v1/completions", &body).await, 0);
    body["cache_salt"] = json!("tenant-b");
    assert_eq!(s.cached("/v1/completions", &body).await, 0);
    body["cache_salt"] = json!("tenant-a");
    assert_eq!(s.cached("/v1/completions", &body).await, 256);
    s.shutdown().await;
}

#[tokio::test]
async fn lru_evicts_at_capacity() {
    let s = start(&["--cache-blocks", "3"]).await;
    let (a, _) = prompt_of_2_5_blocks(&s).await;
    let b = json!({"prompt": format!("Different lead-in. {}", a["prompt"].as_str().unwrap()), "max_tokens": 2});
    assert_eq!(s.cached("/v1/completions", &a).await, 0); // stores 2 blocks
    assert_eq!(s.cached("/v1/completions", &b).await, 0); // needs 2, evicts 1 of a's
    assert_eq!(
        s.metric("prefix_router:cache_blocks_evicted_total").await,
        1.0
    );
    assert_eq!(s.metric("vllm:kv_cache_usage_perc").await, 1.0);
    // a's first block was least recently used and is gone: no leading chain left
    assert_eq!(s.cached("/v1/completions", &a).await, 0);
    s.shutdown().await;
}

#[tokio::test]
async fn chat_and_streaming() {
    let s = start(&[]).await;
    let chat = json!({"messages": [
        {"role": "system", "content": format!("{RUNBOOK}{RUNBOOK}")},
        {"role": "user", "content": "The checkout API returns 502s. What first?"},
    ], "max_tokens": 5});
    let (st, v, h) = s.post("/v1/chat/completions", &chat).await;
    assert_eq!(st, 200);
    assert_eq!(h.get("x-inference-pod").unwrap(), "pod-test");
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["choices"][0]["message"]["role"], "assistant");
    assert!(v["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .starts_with("[simulated]"));
    assert_eq!(v["usage"]["completion_tokens"], 5);
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    assert!(s.cached("/v1/chat/completions", &chat).await >= 256);

    // streaming chat: SSE chunks, usage on the last, then [DONE]
    let mut stream_body = chat.clone();
    stream_body["stream"] = json!(true);
    let r = s
        .http
        .post(s.url("/v1/chat/completions"))
        .json(&stream_body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert!(r.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/event-stream"));
    let datas = common::sse_data(r).await;
    assert_eq!(*datas.last().unwrap(), "[DONE]");
    let chunks: Vec<Value> = datas[..datas.len() - 1]
        .iter()
        .map(|d| serde_json::from_str(d).unwrap())
        .collect();
    assert_eq!(chunks[0]["object"], "chat.completion.chunk");
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    let last = chunks.last().unwrap();
    assert_eq!(last["choices"][0]["finish_reason"], "length");
    assert!(
        last["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap()
            >= 256
    );

    // streaming completions
    let r = s
        .http
        .post(s.url("/v1/completions"))
        .json(&json!({"prompt": "hello", "stream": true, "max_tokens": 3}))
        .send()
        .await
        .unwrap();
    let datas = common::sse_data(r).await;
    assert_eq!(
        datas.len(),
        3 + 1 + 1,
        "3 tokens, a final chunk, [DONE]: {datas:?}"
    );
    assert_eq!(*datas.last().unwrap(), "[DONE]");
    s.shutdown().await;
}

/// The Responses API and Anthropic-style messages render the same chat as chat completions
/// (so they share its cached blocks), in their own answer shapes, whole and streamed.
#[tokio::test]
async fn responses_and_messages_share_the_chats_cache() {
    let s = start(&[]).await;
    let system = format!("{RUNBOOK}{RUNBOOK}");
    let question = "The checkout API returns 502s. What first?";
    let chat = json!({"messages": [
        {"role": "system", "content": system}, {"role": "user", "content": question},
    ], "max_tokens": 5});
    assert_eq!(s.cached("/v1/chat/completions", &chat).await, 0);
    let chat_tokens = s.token_count(&chat).await as u64;

    let resp = json!({"instructions": system, "input": question, "max_output_tokens": 5});
    let (st, v, _) = s.post("/v1/responses", &resp).await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(
        (v["object"].as_str(), v["status"].as_str()),
        (Some("response"), Some("incomplete"))
    );
    assert_eq!(v["incomplete_details"]["reason"], "max_output_tokens");
    assert_eq!(v["output"][0]["content"][0]["type"], "output_text");
    assert!(v["output"][0]["content"][0]["text"]
        .as_str()
        .unwrap()
        .starts_with("[simulated]"));
    assert_eq!(v["usage"]["input_tokens"], chat_tokens);
    assert!(
        v["usage"]["input_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap()
            >= 256
    );

    let msgs = json!({"model": "SmolLM2-135M-Instruct", "max_tokens": 5, "system": system,
        "messages": [{"role": "user", "content": [{"type": "text", "text": question}]}]});
    let (st, v, _) = s.post("/v1/messages", &msgs).await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(
        (v["type"].as_str(), v["stop_reason"].as_str()),
        (Some("message"), Some("max_tokens"))
    );
    assert_eq!(v["content"][0]["type"], "text");
    assert_eq!(v["usage"]["input_tokens"], chat_tokens);
    assert!(v["usage"]["cache_read_input_tokens"].as_u64().unwrap() >= 256);

    // streamed: each API's event sequence
    for (path, mut body, first, last) in [
        (
            "/v1/responses",
            resp,
            "response.created",
            "response.completed",
        ),
        ("/v1/messages", msgs, "message_start", "message_stop"),
    ] {
        body["stream"] = json!(true);
        let r = s.http.post(s.url(path)).json(&body).send().await.unwrap();
        assert_eq!(r.status(), 200);
        let events = common::sse_events(r).await;
        assert_eq!(events.first().unwrap().0, first, "{events:?}");
        assert_eq!(events.last().unwrap().0, last, "{events:?}");
        let deltas = events
            .iter()
            .filter(|(e, _)| e == "response.output_text.delta" || e == "content_block_delta")
            .count();
        assert_eq!(deltas, 5, "{path}: one per token");
    }

    // what vLLM refuses, refused alike; a continued response is not stored here
    let (st, v, _) = s
        .post("/v1/messages", &json!({"model": "m", "messages": []}))
        .await;
    assert_eq!(
        (st, v["error"]["param"].as_str()),
        (400, Some("max_tokens"))
    );
    let (st, v, _) = s
        .post(
            "/v1/responses",
            &json!({"input": "x", "previous_response_id": "resp_9"}),
        )
        .await;
    assert_eq!(
        (st, v["error"]["param"].as_str()),
        (404, Some("response_id"))
    );
    s.shutdown().await;
}

/// A batch of prompts is answered as vLLM answers it: one choice per prompt, in order, usage
/// summed; streamed, each chunk's choice carries its prompt's index.
#[tokio::test]
async fn batched_prompts_get_one_choice_each() {
    let s = start(&[]).await;
    let (st, v, _) = s
        .post(
            "/v1/completions",
            &json!({"prompt": ["hello there", [1, 2, 3], "third"], "max_tokens": 2}),
        )
        .await;
    assert_eq!(st, 200, "{v}");
    let choices = v["choices"].as_array().unwrap();
    assert_eq!(choices.len(), 3);
    for (i, c) in choices.iter().enumerate() {
        assert_eq!(c["index"], i);
        assert!(!c["text"].as_str().unwrap().is_empty());
    }
    assert_eq!(v["usage"]["completion_tokens"], 6);
    let single = |p: Value| {
        let s = &s;
        async move {
            let (_, v, _) = s
                .post("/v1/completions", &json!({"prompt": p, "max_tokens": 2}))
                .await;
            v["usage"]["prompt_tokens"].as_u64().unwrap()
        }
    };
    let sum = single(json!("hello there")).await + 3 + single(json!("third")).await;
    assert_eq!(v["usage"]["prompt_tokens"], sum);
    // streamed
    let r = s
        .http
        .post(s.url("/v1/completions"))
        .json(&json!({"prompt": ["a b c", "d e f"], "max_tokens": 2, "stream": true}))
        .send()
        .await
        .unwrap();
    let datas = common::sse_data(r).await;
    assert_eq!(*datas.last().unwrap(), "[DONE]");
    let indexes: Vec<u64> = datas[..datas.len() - 1]
        .iter()
        .map(|d| {
            serde_json::from_str::<Value>(d).unwrap()["choices"][0]["index"]
                .as_u64()
                .unwrap()
        })
        .collect();
    assert_eq!(
        indexes,
        [0, 0, 0, 1, 1, 1],
        "2 tokens and a final chunk each"
    );
    // one bad prompt rejects the batch
    let (st, v, _) = s
        .post("/v1/completions", &json!({"prompt": [[1, 2], [999999999]]}))
        .await;
    assert_eq!(st, 400, "{v}");
    s.shutdown().await;
}

#[tokio::test]
async fn models_health_tokenize() {
    let s = start(&[]).await;
    let v: Value = s
        .http
        .get(s.url("/v1/models"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(v["data"][0]["id"], "SmolLM2-135M-Instruct");
    let r = s.http.get(s.url("/health")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let (st, v, _) = s
        .post(
            "/tokenize",
            &json!({"messages": [{"role": "user", "content": "hi"}]}),
        )
        .await;
    assert_eq!(st, 200);
    assert_eq!(v["tokens"][0], 1, "chat starts with <|im_start|>");
    assert_eq!(v["block_hashes"].as_array().unwrap().len(), 0);
    let r = s.http.get(s.url("/nope")).send().await.unwrap();
    assert_eq!(r.status(), 404);
    assert_eq!(r.headers()["x-inference-pod"], "pod-test");
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["code"], "not_found");
    // a known path with the wrong method: 405, as JSON like every other error
    for path in ["/v1/completions", "/v1/chat/completions", "/tokenize"] {
        let r = s.http.get(s.url(path)).send().await.unwrap();
        assert_eq!(r.status(), 405, "{path}");
        assert_eq!(r.headers()["content-type"], "application/json");
        let v: Value = r.json().await.unwrap();
        assert_eq!(v["error"]["code"], "method_not_allowed", "{path}");
        assert_eq!(v["error"]["type"], "invalid_request_error");
    }
    s.shutdown().await;
}

#[tokio::test]
async fn bad_input_gets_openai_errors() {
    let s = start(&["--max-body-bytes", "2048", "--max-model-len", "200"]).await;
    let cases: Vec<(&str, Vec<u8>, u16)> = vec![
        ("/v1/completions", b"{not json".to_vec(), 400),
        ("/v1/completions", b"\xff\xfe\x00garbage".to_vec(), 400),
        (
            "/v1/completions",
            br#"{"model":"SmolLM2-135M-Instruct"}"#.to_vec(),
            400,
        ),
        ("/v1/completions", br#"{"prompt":""}"#.to_vec(), 400),
        ("/v1/completions", br#"{"prompt":{"a":1}}"#.to_vec(), 400),
        (
            "/v1/completions",
            br#"{"prompt":"x","max_tokens":"many"}"#.to_vec(),
            400,
        ),
        ("/v1/chat/completions", br#"{"messages":[]}"#.to_vec(), 400),
        (
            "/v1/chat/completions",
            br#"{"messages":[{"role":"user","content":5}]}"#.to_vec(),
            400,
        ),
        (
            "/v1/completions",
            br#"{"model":"gpt-4","prompt":"hi"}"#.to_vec(),
            404,
        ),
        (
            "/v1/completions",
            json!({"prompt": "x".repeat(4000)}).to_string().into_bytes(),
            413,
        ),
        (
            "/v1/completions",
            json!({"prompt": "word ".repeat(300)})
                .to_string()
                .into_bytes(),
            400,
        ),
    ];
    for (path, body, want) in cases {
        let shown = String::from_utf8_lossy(&body)
            .chars()
            .take(60)
            .collect::<String>();
        let (st, v, h) = s.post_raw(path, body).await;
        assert_eq!(st, want, "{path} {shown}: {v}");
        assert!(v["error"]["message"].is_string(), "{shown}: {v}");
        assert!(v["error"]["type"].is_string());
        assert!(v["error"].get("param").is_some() && v["error"].get("code").is_some());
        assert_eq!(h["x-inference-pod"], "pod-test");
    }
    // the server is still serving after all that
    assert_eq!(
        s.cached("/v1/completions", &json!({"prompt": "still alive"}))
            .await,
        0
    );
    assert!(s.metric("prefix_router:requests_rejected_total").await >= 11.0);
    s.shutdown().await;
}

#[tokio::test]
async fn full_queue_is_429_and_shutdown_drains() {
    let s = start(&[
        "--max-num-seqs",
        "1",
        "--max-waiting",
        "0",
        "--sim-decode-ms-per-token",
        "20",
    ])
    .await;
    let slow = {
        let http = s.http.clone();
        let url = s.url("/v1/completions");
        tokio::spawn(async move {
            http.post(url)
                .json(&json!({"prompt": "slow one", "max_tokens": 25}))
                .send()
                .await
                .unwrap()
        })
    };
    // wait until it is running
    let running = async {
        while s.metric("vllm:num_requests_running").await < 1.0 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(30), running)
        .await
        .expect("the slow request never started running");
    let (st, v, _) = s.post("/v1/completions", &json!({"prompt": "x"})).await;
    assert_eq!(st, 429, "{v}");
    assert_eq!(v["error"]["type"], "rate_limit_error");
    // shut down while the slow request is in flight: it still completes
    s.shutdown().await;
    let r = slow.await.unwrap();
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["usage"]["completion_tokens"], 25);
}

#[tokio::test]
async fn bad_config_names_the_field() {
    let config = Config::try_parse_from(["model-server", "--block-size", "0"]).unwrap();
    let err = config.validate().unwrap_err().to_string();
    assert!(err.contains("--block-size"), "{err}");
    let config =
        Config::try_parse_from(["model-server", "--tokenizer", "/nonexistent/tokenizer.json"])
            .unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let err = run(config, listener, async {}).await.unwrap_err();
    assert!(
        format!("{err:#}").contains("/nonexistent/tokenizer.json"),
        "{err:#}"
    );
}

#[tokio::test]
async fn cache_events_endpoint() {
    let s = start(&["--cache-blocks", "2"]).await;
    let events = |since: u64| {
        let url = s.url(&format!("/v1/cache/events?since={since}"));
        let http = s.http.clone();
        async move {
            http.get(url)
                .send()
                .await
                .unwrap()
                .json::<Value>()
                .await
                .unwrap()
        }
    };
    let v = events(0).await;
    assert_eq!(v["seq"], 0);
    assert_eq!(v["events"].as_array().unwrap().len(), 0);
    let epoch = v["epoch"].as_str().unwrap().to_owned();
    assert_eq!(epoch.len(), 16);
    assert_eq!(v["load"]["running"], 0);

    let (a, _) = prompt_of_2_5_blocks(&s).await;
    s.cached("/v1/completions", &a).await;
    let (_, t, _) = s.post("/tokenize", &a).await;
    let v = events(0).await;
    assert_eq!(v["events"][0]["type"], "BlockStored");
    assert_eq!(v["events"][0]["hashes"], t["block_hashes"]);
    assert_eq!(v["epoch"], epoch.as_str());
    let seq = v["seq"].as_u64().unwrap();

    // a different prompt evicts both blocks (capacity 2): BlockRemoved then BlockStored
    let b = json!({"prompt": format!("Other: {}", a["prompt"].as_str().unwrap()), "max_tokens": 1});
    s.cached("/v1/completions", &b).await;
    let v = events(seq).await;
    let types: Vec<&str> = v["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["type"].as_str().unwrap())
        .collect();
    assert!(types.contains(&"BlockRemoved"), "{v}");
    assert!(!v["reset"].as_bool().unwrap());
    // asking from a future seq (another epoch) resyncs with a snapshot
    let v = events(1_000_000).await;
    assert!(v["reset"].as_bool().unwrap());
    assert_eq!(v["snapshot"].as_array().unwrap().len(), 2);
    s.shutdown().await;
}

/// Requests that would make a pod work without bound are refused up front with vLLM's
/// words, and a prompt far over the context is refused before it is tokenized.
#[tokio::test]
async fn unbounded_work_is_refused_with_the_numbers() {
    let s = start(&["--max-model-len", "300", "--max-batch-prompts", "4"]).await;
    // prompt + max_tokens over the context: 400 naming every number
    let (st, v, _) = s
        .post(
            "/v1/completions",
            &json!({"prompt": "hello there", "max_tokens": 4_000_000_000u64}),
        )
        .await;
    assert_eq!(st, 400, "{v}");
    let msg = v["error"]["message"].as_str().unwrap();
    assert!(
        msg.contains("4000000000") && msg.contains("300") && msg.contains("input tokens"),
        "{msg}"
    );
    assert_eq!(v["error"]["param"], "max_tokens");
    assert_eq!(v["error"]["code"], "context_length_exceeded");
    // one that fits is served, and without max_tokens the default fits what is left
    let (st, v, _) = s
        .post(
            "/v1/completions",
            &json!({"prompt": "hello there", "max_tokens": 280}),
        )
        .await;
    assert_eq!(st, 200, "{v}");
    // batches beyond --max-batch-prompts
    let (st, v, _) = s
        .post(
            "/v1/completions",
            &json!({"prompt": ["a", "b", "c", "d", "e"]}),
        )
        .await;
    assert_eq!(st, 400, "{v}");
    assert!(v["error"]["message"]
        .as_str()
        .unwrap()
        .contains("at most 4"));
    // a one-word megabyte over a 300-token context: refused as at least N tokens
    let (st, v, _) = s
        .post("/v1/completions", &json!({"prompt": "a".repeat(1 << 20)}))
        .await;
    assert_eq!(st, 400, "{v}");
    let msg = v["error"]["message"].as_str().unwrap();
    assert!(msg.contains("at least"), "{msg}");
    assert_eq!(v["error"]["code"], "context_length_exceeded");
    s.shutdown().await;
}

/// A prompt that takes long to tokenize (one 3 MiB word of random letters, under a context
/// large enough that it must be tokenized) does not hold up a small request sent after it:
/// the small one is answered while the large one is still in flight.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_small_request_is_answered_while_a_huge_prompt_is_tokenized() {
    let s = start(&["--max-model-len", "4000000"]).await;
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let word: String = (0..3 << 20)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            char::from(b'a' + (x % 26) as u8)
        })
        .collect();
    let big = json!({"prompt": word, "max_tokens": 1})
        .to_string()
        .into_bytes();
    let url = s.url("/v1/completions");
    let huge = tokio::spawn(async move {
        reqwest::Client::new()
            .post(url)
            .header("content-type", "application/json")
            .body(big)
            .send()
            .await
            .map(|r| r.status().as_u16())
    });
    // the big body is being read or tokenized once the server counts it in flight: the
    // small request goes after it
    let (st, v, _) = s
        .post(
            "/v1/completions",
            &json!({"prompt": "a small request", "max_tokens": 1}),
        )
        .await;
    assert_eq!(st, 200, "{v}");
    assert!(
        !huge.is_finished(),
        "the huge prompt should still be in flight when the small one is answered"
    );
    assert_eq!(huge.await.unwrap().unwrap(), 200);
    s.shutdown().await;
}

/// With `--api-key`, every /v1 path wants the key (401 JSON otherwise), as vLLM's; health,
/// metrics and tokenize stay open.
#[tokio::test]
async fn an_api_key_guards_the_v1_paths() {
    let s = start(&["--api-key", "s3cret"]).await;
    let http = reqwest::Client::new();
    let body = json!({"prompt": "hello", "max_tokens": 1});
    for auth in [
        None,
        Some("Bearer wrong"),
        Some("s3cret"),
        Some("Bearer s3cret2"),
    ] {
        let mut req = http.post(s.url("/v1/completions")).json(&body);
        if let Some(a) = auth {
            req = req.header("authorization", a);
        }
        let r = req.send().await.unwrap();
        assert_eq!(r.status(), 401, "{auth:?}");
        let v: Value = r.json().await.unwrap();
        assert_eq!(v["error"]["code"], "invalid_api_key");
    }
    let r = http
        .post(s.url("/v1/completions"))
        .header("authorization", "Bearer s3cret")
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let events = http.get(s.url("/v1/cache/events")).send().await.unwrap();
    assert_eq!(events.status(), 401, "the cache events are guarded too");
    for path in ["/health", "/metrics"] {
        assert_eq!(
            http.get(s.url(path)).send().await.unwrap().status(),
            200,
            "{path}"
        );
    }
    s.shutdown().await;
}
