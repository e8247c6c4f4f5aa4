//! Hostile clients against the real gateway (Envoy + the filter) and against a pod directly:
//! one request must never stall either. Every case gets its answer (an OpenAI-style JSON 4xx,
//! or a 200), every process stays up, and a small request sent afterwards, or while the
//! hostile one is still in flight, is answered. Function only, no timings: the bench
//! (`scripts/bench.sh hostile`) prints how long each case takes.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use serde_json::{json, Value};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;
use test_harness::fleet::{Fleet, ZERO_COST};
use test_harness::hostile::{cases, Expect};

/// A client that waits long enough for any case here (the answers come far sooner).
fn client() -> reqwest::blocking::Client {
    reqwest::blocking::Client::builder()
        .timeout(Duration::from_secs(120))
        .build()
        .unwrap()
}

fn post_raw(
    http: &reqwest::blocking::Client,
    url: &str,
    body: Vec<u8>,
    headers: &[(&str, &str)],
) -> (u16, Value) {
    let mut req = http
        .post(url)
        .header("content-type", "application/json")
        .body(body);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let r = req.send().unwrap_or_else(|e| panic!("{url}: {e}"));
    let status = r.status().as_u16();
    (status, r.json().unwrap_or(Value::Null))
}

/// A small completion through `base`: answered 200.
fn small_ok(http: &reqwest::blocking::Client, base: &str, tag: &str) {
    let body = json!({"prompt": format!("a small request {tag}"), "max_tokens": 1});
    let (st, v) = post_raw(
        http,
        &format!("{base}/v1/completions"),
        body.to_string().into_bytes(),
        &[],
    );
    assert_eq!(st, 200, "small request after {tag}: {v}");
}

fn all_alive(f: &mut Fleet) {
    for p in &mut f.pods {
        assert!(p.proc.exited().is_none(), "pod {} died", p.name);
    }
    assert!(f.envoy.proc.exited().is_none(), "envoy died");
}

#[test]
fn hostile_requests_get_answers_and_leave_both_gateway_and_pods_serving() {
    let mut f = Fleet::start("hostile", 2, &ZERO_COST, |_| {}).unwrap();
    let http = client();
    let gateway = f.envoy.url("");
    let gateway = gateway.trim_end_matches('/').to_owned();
    let pod = format!("http://{}", f.pods[0].addr);
    for case in cases() {
        for (target, base) in [("envoy", &gateway), ("pod", &pod)] {
            let what = format!("{} at {target}", case.name);
            let (st, v) = post_raw(
                &http,
                &format!("{base}{}", case.path),
                case.body.clone(),
                &case.headers,
            );
            match case.expect {
                Expect::Ok => assert_eq!(st, 200, "{what}: {v}"),
                Expect::ClientError => {
                    assert!((400..500).contains(&st), "{what}: {st} {v}");
                    assert!(v["error"]["message"].is_string(), "{what}: not JSON: {v}");
                }
            }
            small_ok(&http, base, &what);
        }
        all_alive(&mut f);
    }
}

/// Six huge bodies at once, through Envoy: a small request sent right after them is answered
/// and each of them gets its 4xx. (They are refused within milliseconds now, so whether they
/// are still in flight when the small one is answered is not asserted; the trickled body
/// below and the server's own test are in flight by construction.)
#[test]
fn a_small_request_is_answered_amid_six_huge_ones() {
    let mut f = Fleet::start("hostile-concurrent", 2, &ZERO_COST, |_| {}).unwrap();
    let base = f.envoy.url("").trim_end_matches('/').to_owned();
    let huge: Vec<_> = (0..6)
        .map(|i| {
            let url = format!("{base}/v1/completions");
            let word: String = std::iter::repeat_n((b'a' + i as u8) as char, 3 << 20).collect();
            let body = json!({"prompt": word}).to_string().into_bytes();
            std::thread::spawn(move || post_raw(&client(), &url, body, &[]).0)
        })
        .collect();
    small_ok(&client(), &base, "six 3 MiB one-word prompts");
    for h in huge {
        let st = h.join().unwrap();
        assert!((400..500).contains(&st), "{st}");
    }
    all_alive(&mut f);
}

/// A body trickled in (slow loris) holds one connection, not the gateway: a small request
/// is answered while it is still unanswered, and Envoy ends it by its request timeout.
#[test]
fn a_trickled_body_does_not_hold_up_other_requests() {
    let mut f = Fleet::start("hostile-slow", 2, &ZERO_COST, |s| {
        s.limits.request_timeout = "3s".into()
    })
    .unwrap();
    let base = f.envoy.url("").trim_end_matches('/').to_owned();
    let addr = base.trim_start_matches("http://").to_owned();
    let mut slow = TcpStream::connect(&addr).unwrap();
    write!(
        slow,
        "POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: 100000\r\n\r\n{{\"prompt\": \"aaaa"
    )
    .unwrap();
    for i in 0..3 {
        slow.write_all(b"aaaa").unwrap();
        small_ok(&client(), &base, &format!("a trickled body, part {i}"));
    }
    // nothing came back on the slow connection yet: it was in flight all along
    slow.set_nonblocking(true).unwrap();
    let mut buf = [0u8; 512];
    assert!(
        matches!(slow.read(&mut buf), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock),
        "the trickled request was answered early"
    );
    // Envoy gives up on it (408) once the request timeout passes
    slow.set_nonblocking(false).unwrap();
    slow.set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let mut got = Vec::new();
    let _ = slow.read_to_end(&mut got);
    let text = String::from_utf8_lossy(&got);
    assert!(text.starts_with("HTTP/1.1 408"), "{text}");
    all_alive(&mut f);
}

/// Only the inference API is routed: a pod's metrics, cache events, tokenize and health
/// endpoints answer 404 (JSON) through the listener, while they answer at the pod.
#[test]
fn internal_endpoints_are_not_reachable_through_the_listener() {
    let f = Fleet::start("hostile-paths", 2, &ZERO_COST, |_| {}).unwrap();
    let http = client();
    let pod = format!("http://{}", f.pods[0].addr);
    for (method, path) in [
        ("GET", "/metrics"),
        ("GET", "/v1/cache/events"),
        ("GET", "/v1/cache/events?since=0"),
        ("POST", "/tokenize"),
        ("GET", "/health"),
        ("GET", "/"),
        ("GET", "/v1/completions/../../metrics"),
        ("GET", "/stats/prometheus"),
    ] {
        let send = |url: String| {
            let req = match method {
                "GET" => http.get(url),
                _ => http.post(url).json(&json!({"prompt": "x"})),
            };
            let r = req.send().unwrap();
            (
                r.status().as_u16(),
                r.json::<Value>().unwrap_or(Value::Null),
            )
        };
        let (st, v) = send(f.envoy.url(path));
        assert_eq!(st, 404, "{method} {path} through the listener: {v}");
        assert_eq!(v["error"]["code"], "not_found", "{path}: {v}");
        if !path.contains("..") && path != "/" && path != "/stats/prometheus" {
            assert_eq!(send(format!("{pod}{path}")).0, 200, "{path} at the pod");
        }
    }
    // the API itself is served, with query strings too
    let r = http.get(f.envoy.url("/v1/models?x=1")).send().unwrap();
    assert_eq!(r.status(), 200);
}

/// Headers that try to pick a pod, a cluster, or Envoy's own behaviour are not honoured: a
/// repeated prompt goes to the pod holding it whichever member a client names. (The pods
/// take 300 ms to answer, so an honoured 1 ms timeout would show as a 504; Envoy 1.40
/// already ignores x-envoy-* control headers from clients it does not take as internal, and
/// the config makes that explicit.)
#[test]
fn headers_that_try_to_steer_are_ignored() {
    let slow = [
        "--sim-ttft-base-ms",
        "300",
        "--sim-prefill-us-per-token",
        "0",
        "--sim-decode-ms-per-token",
        "0",
    ];
    let f = Fleet::start("hostile-headers", 2, &slow, |_| {}).unwrap();
    let lead = "Check the replication lag, the disk queue and the last deploy before you page. ";
    let body = json!({"prompt": lead.repeat(30), "max_tokens": 1});
    let first = f.send("/v1/completions", &body, &[]);
    assert_eq!(first.status, 200, "{}", first.body);
    let owner = first.pod.clone();
    let other = f
        .pods
        .iter()
        .find(|p| p.name != owner)
        .unwrap()
        .addr
        .clone();
    for (name, value) in [
        ("x-gateway-destination-endpoint", other.as_str()),
        ("x-gateway-destination-endpoint", "127.0.0.1:1"),
        ("x-prefix-router-cluster", "pod_polls"),
        ("x-envoy-original-dst-host", other.as_str()),
        ("x-envoy-upstream-rq-timeout-ms", "1"),
        ("x-envoy-max-retries", "100"),
        ("x-envoy-retry-on", "5xx"),
        ("x-forwarded-for", "10.0.0.1"),
    ] {
        let a = f.send("/v1/completions", &body, &[(name, value)]);
        assert_eq!(a.status, 200, "{name}: {value}: {}", a.body);
        assert_eq!(a.pod, owner, "{name}: {value} moved the request");
        assert_eq!(a.reason(), "prefix-hit", "{name}: {value}");
    }
}

/// Killing the filter's VM (the test-only crash header) is followed by a working filter:
/// Envoy starts a new VM and requests are routed with decisions again.
#[test]
fn a_crashed_filter_vm_is_started_again() {
    let f = Fleet::start("hostile-crash", 2, &ZERO_COST, |s| {
        s.extra
            .insert("test_only_crash_header".into(), json!("x-test-crash"));
    })
    .unwrap();
    let body = json!({"prompt": "after the crash", "max_tokens": 1});
    let before = f.send("/v1/completions", &body, &[]);
    assert_eq!(before.status, 200);
    assert!(!before.reason().is_empty());
    let crashed = f.send("/v1/completions", &body, &[("x-test-crash", "1")]);
    assert_eq!(crashed.status, 503, "{}", crashed.body);
    assert!(
        crashed.body["error"]["message"].is_string(),
        "{}",
        crashed.body
    );
    // the next requests are routed by a new VM: each on a new connection, so that both
    // workers, the one whose VM failed included, get some
    let back = f.wait(Duration::from_secs(30), || {
        let fresh = client();
        let r = fresh
            .post(f.envoy.url("/v1/completions"))
            .json(&body)
            .send();
        let ok = r.is_ok_and(|r| {
            r.status() == 200
                && r.headers()
                    .get(prefix_core::protocol::headers::debug::REASON)
                    .is_some()
        });
        ok && f.stat(&f.envoy, "envoy_wasm_prefix_router_vm_reload_success") >= 1.0
    });
    assert!(back, "the filter never came back");
    for _ in 0..8 {
        let a = f.send("/v1/completions", &body, &[]);
        assert_eq!(a.status, 200, "{}", a.body);
        assert!(!a.reason().is_empty());
    }
}

/// Timeouts bound silence, not length: with a 1.5 s idle timeout, an answer streamed over 3 s
/// (a token every 100 ms) arrives whole, while the same answer not streamed (nothing sent for
/// 3 s) is ended by Envoy with a JSON 504.
#[test]
fn a_long_stream_survives_the_idle_timeout_a_silent_answer_does_not() {
    let decoding = [
        "--sim-ttft-base-ms",
        "0",
        "--sim-prefill-us-per-token",
        "0",
        "--sim-decode-ms-per-token",
        "100",
    ];
    let f = Fleet::start("hostile-timeouts", 1, &decoding, |s| {
        s.limits.stream_idle_timeout = "1.5s".into();
    })
    .unwrap();
    let stream = json!({"prompt": "count slowly", "max_tokens": 30, "stream": true});
    let r = client()
        .post(f.envoy.url("/v1/completions"))
        .json(&stream)
        .send()
        .unwrap();
    assert_eq!(r.status(), 200);
    let text = r.text().unwrap();
    assert!(
        text.trim_end().ends_with("data: [DONE]"),
        "cut short: {text}"
    );
    let silent = json!({"prompt": "count slowly", "max_tokens": 30});
    let a = f.send("/v1/completions", &silent, &[]);
    assert_eq!(a.status, 504, "{}", a.body);
    assert!(a.body["error"]["message"].is_string(), "{}", a.body);
}
