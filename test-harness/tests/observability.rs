//! What a user looks at: the Prometheus rules and the Grafana dashboard in
//! `deploy/kubernetes/base`, every expression executed against a real Prometheus scraping a
//! real fleet (pods + Envoy with the filter, through Envoy's stats listener) after traffic; a
//! query that answers nothing fails. A pod killed makes the pod-down alert fire. The stats
//! listener serves metrics and readiness only. The pods' panels are read with this project's
//! pods, llama.cpp's and vLLM's.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use prefix_core::protocol::defaults::MODEL_NAME;
use serde_json::{json, Value};
use std::time::Duration;
use test_harness::cluster::PodKind;
use test_harness::fleet::{Fleet, ZERO_COST};
use test_harness::paths;
use test_harness::process::free_port;
use test_harness::prometheus::Prometheus;

const LEAD: &str = "You are the on-call assistant for the payments platform. Before answering, \
restate the incident in one sentence, list the dashboards you would open, the alerts that \
fired, the last three deploys and who owns each service involved; then propose the first \
three diagnostic steps, in order, with the exact commands to run and what each result means. ";

fn observability(file: &str) -> String {
    std::fs::read_to_string(paths::repo_root().join("deploy/kubernetes/base").join(file)).unwrap()
}

/// The left operands of an alert's comparisons: `(a == 0) and (b > 0)` → `a`, `b`. These are
/// what must answer after traffic (the alert itself is meant to be empty when all is well).
fn signals(expr: &str) -> Vec<String> {
    fn top_level(s: &str, pat: &str) -> Vec<usize> {
        let mut depth = 0i32;
        let mut at = Vec::new();
        for (i, c) in s.char_indices() {
            match c {
                '(' | '{' | '[' => depth += 1,
                ')' | '}' | ']' => depth -= 1,
                _ if depth == 0 && s[i..].starts_with(pat) => at.push(i),
                _ => {}
            }
        }
        at
    }
    fn unwrap_parens(s: &str) -> &str {
        let t = s.trim();
        if t.starts_with('(') && t.ends_with(')') && top_level(&t[1..t.len() - 1], ")").is_empty() {
            unwrap_parens(&t[1..t.len() - 1])
        } else {
            t
        }
    }
    let mut parts = Vec::new();
    let mut rest = expr.trim();
    while let Some(&i) = top_level(rest, " and ").first() {
        parts.push(&rest[..i]);
        rest = &rest[i + 5..];
    }
    parts.push(rest);
    parts
        .into_iter()
        .map(|p| {
            let p = unwrap_parens(p);
            let cut = [" == ", " != ", " >= ", " <= ", " > ", " < "]
                .iter()
                .filter_map(|op| top_level(p, op).last().copied())
                .max();
            unwrap_parens(cut.map_or(p, |i| &p[..i])).to_owned()
        })
        .collect()
}

/// The rules as shipped, with `for:` cut to 0s so that an alert fires within a test.
fn rules_firing_at_once(dir: &std::path::Path) -> std::path::PathBuf {
    let rules_file = dir.join("rules.yml");
    std::fs::write(
        &rules_file,
        observability("prometheus-rules.yml")
            .lines()
            .map(|l| {
                if l.trim_start().starts_with("for: ") {
                    format!("{}for: 0s", &l[..l.len() - l.trim_start().len()])
                } else {
                    l.to_owned()
                }
            })
            .collect::<Vec<_>>()
            .join("\n"),
    )
    .unwrap();
    rules_file
}

/// Reads a dashboard with Grafana's own schema (the Foundation SDK's models, generated from
/// it, for Grafana 10.1) and writes it back: a field the schema does not know is lost on the
/// way, and its path printed.
const SCHEMA_CHECK: &str = r#"
import json, sys
from grafana_foundation_sdk.cog.plugins import register_default_plugins
from grafana_foundation_sdk.models.dashboard import Dashboard
register_default_plugins()
src = json.load(sys.stdin)
def plain(o):
    if hasattr(o, "to_json"): return o.to_json()
    return o.value if hasattr(o, "value") else str(o)
back = json.loads(json.dumps(Dashboard.from_json(src).to_json(), default=plain))
lost = []
def walk(a, b, path):
    if isinstance(a, dict):
        if not isinstance(b, dict): lost.append(path); return
        for k, v in a.items():
            if k in b: walk(v, b[k], f"{path}.{k}")
            else: lost.append(f"{path}.{k}")
    elif isinstance(a, list):
        if not isinstance(b, list) or len(a) != len(b): lost.append(path); return
        for i, (x, y) in enumerate(zip(a, b)): walk(x, y, f"{path}[{i}]")
    elif a != b and not (isinstance(a, (int, float)) and isinstance(b, (int, float)) and a == b):
        lost.append(f"{path}: {a!r} read as {b!r}")
walk(src, back, "dashboard")
print(json.dumps(lost))
"#;

/// The fields of `dashboard` that Grafana's schema does not know.
fn unknown_to_grafana(dashboard: &Value) -> Vec<String> {
    use std::io::Write;
    let mut child = std::process::Command::new(paths::repo_root().join(".venv/bin/python"))
        .args(["-c", SCHEMA_CHECK])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect(".venv/bin/python with grafana-foundation-sdk (scripts/setup.sh)");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(dashboard.to_string().as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "the schema check failed to run");
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn the_dashboard_fits_grafanas_schema() {
    let dash: Value = serde_json::from_str(&observability("grafana-dashboard.json")).unwrap();
    assert_eq!(unknown_to_grafana(&dash), Vec::<String>::new());
    // the check can fail: misspelt fields are found where they are
    let mut bad = dash.clone();
    let panel = bad["panels"][0].as_object_mut().unwrap();
    let pos = panel.remove("gridPos").unwrap();
    panel.insert("gridPosition".into(), pos);
    bad["panels"][1]["targets"][0]["expression"] = json!("up");
    assert_eq!(
        unknown_to_grafana(&bad),
        [
            "dashboard.panels[0].gridPosition",
            "dashboard.panels[1].targets[0].expression"
        ]
    );
}

#[test]
fn alert_signals_are_the_left_operands() {
    assert_eq!(
        signals("(prefix_router_pod_healthy == 0) and (prefix_router_pod_signals > 0)"),
        ["prefix_router_pod_healthy", "prefix_router_pod_signals"]
    );
    assert_eq!(
        signals("sum by (instance) (rate(x[5m])) > 1"),
        ["sum by (instance) (rate(x[5m]))"]
    );
    assert_eq!(
        signals("max by (pod) (y{a=\"b > c\"}) > 16"),
        ["max by (pod) (y{a=\"b > c\"})"]
    );
}

#[test]
fn every_rule_and_dashboard_query_answers_after_traffic() {
    let stats_port = free_port().unwrap();
    let f = Fleet::start("observability", 3, &ZERO_COST, |s| {
        s.stats_port = Some(stats_port)
    })
    .unwrap();
    f.wait_polled(&f.envoy).unwrap();

    // the stats listener: metrics and readiness, nothing else of the admin
    let stats = |path: &str| {
        f.http
            .get(format!("http://127.0.0.1:{stats_port}{path}"))
            .send()
            .unwrap()
    };
    let r = stats("/stats/prometheus");
    assert_eq!(r.status(), 200);
    assert!(r.text().unwrap().contains("prefix_router_members"));
    assert_eq!(stats("/ready").status(), 200);
    for path in ["/clusters", "/config_dump", "/quitquitquit", "/stats"] {
        assert_eq!(stats(path).status(), 404, "{path} must not be reachable");
    }
    let post = f
        .http
        .post(format!("http://127.0.0.1:{stats_port}/quitquitquit"))
        .send()
        .unwrap();
    assert_eq!(post.status(), 404);

    let rules_text = observability("prometheus-rules.yml");
    let rules_file = rules_firing_at_once(&f.dir);
    let prom =
        Prometheus::start_with_rules(&f.addrs(), Some(stats_port), Some(&rules_file), &f.dir)
            .unwrap();

    // Prometheus has the counters before the traffic, so that rates see it
    prom.wait_for("prefix_router_decisions", Duration::from_secs(30), |s| {
        !s.is_empty()
    })
    .unwrap();
    // traffic: a repeated long prompt (hits), different ones (cold), short ones, a stream
    let long = |tag: &str| json!({"prompt": format!("{tag} {LEAD}{LEAD}"), "max_tokens": 2});
    for _ in 0..6 {
        assert_eq!(
            f.send("/v1/completions", &long("incident 7"), &[]).status,
            200
        );
    }
    for i in 0..12 {
        assert_eq!(
            f.send("/v1/completions", &long(&format!("ticket {i}")), &[])
                .status,
            200
        );
        let short = json!({"prompt": format!("hi {i}"), "max_tokens": 2});
        assert_eq!(f.send("/v1/completions", &short, &[]).status, 200);
    }
    let chat =
        json!({"messages": [{"role": "user", "content": LEAD}], "max_tokens": 2, "stream": true});
    assert_eq!(f.send("/v1/chat/completions", &chat, &[]).status, 200);

    let answers = |promql: &str| {
        prom.wait_for(promql, Duration::from_secs(30), |s| !s.is_empty())
            .unwrap_or_else(|e| panic!("{e}"))
    };
    // every recording rule and every alert's signals
    let rules: Value = serde_norway::from_str(&rules_text).unwrap();
    let (mut recorded, mut alerts) = (0, 0);
    for group in rules["groups"].as_array().unwrap() {
        for rule in group["rules"].as_array().unwrap() {
            let expr = rule["expr"].as_str().unwrap();
            if let Some(name) = rule["record"].as_str() {
                answers(expr);
                answers(name);
                recorded += 1;
            } else {
                for s in signals(expr) {
                    answers(&s);
                }
                alerts += 1;
            }
        }
    }
    assert!(
        recorded >= 6 && alerts >= 4,
        "{recorded} records, {alerts} alerts"
    );
    // every query of every dashboard panel
    let dash: Value = serde_json::from_str(&observability("grafana-dashboard.json")).unwrap();
    let mut queries = 0;
    for panel in dash["panels"].as_array().unwrap() {
        for t in panel["targets"].as_array().unwrap() {
            let got = answers(t["expr"].as_str().unwrap());
            assert!(!got.is_empty(), "{}", panel["title"]);
            queries += 1;
        }
    }
    assert!(queries >= 12);
    // the ones that must show the traffic, not just exist
    prom.wait_for(
        "prefix_router:prefix_hit_ratio:rate5m",
        Duration::from_secs(30),
        |s| s.first().is_some_and(|x| x.1 > 0.0),
    )
    .unwrap();
    let by_reason = prom
        .by_label("sum by (reason) (prefix_router_decisions)", "reason")
        .unwrap();
    assert_eq!(by_reason.get("prefix_hit"), Some(&5.0), "{by_reason:?}");
    assert!(by_reason.get("short_prompt").is_some_and(|n| *n >= 12.0));
    // no alert fires on a healthy fleet
    let firing = prom.query("ALERTS{alertstate=\"firing\"}").unwrap();
    assert!(firing.is_empty(), "{firing:?}");

    // a pod killed: the pod-down alert fires for it, by address
    let mut f = f;
    let victim = f.pods[1].addr.clone();
    f.pods[1].proc.kill();
    prom.wait_for(
        "ALERTS{alertname=\"PrefixRouterPodDown\",alertstate=\"firing\"}",
        Duration::from_secs(30),
        |s| s.iter().any(|(l, _)| l.get("pod") == Some(&victim)),
    )
    .unwrap();
}

/// A filter whose VM fails on every request (the test-only crash header on each one) makes
/// no decisions while requests keep arriving: the not-deciding alert fires.
#[test]
fn a_filter_that_keeps_failing_fires_the_not_deciding_alert() {
    let stats_port = free_port().unwrap();
    let f = Fleet::start("observability-crash", 2, &ZERO_COST, |s| {
        s.stats_port = Some(stats_port);
        s.extra
            .insert("test_only_crash_header".into(), json!("x-test-crash"));
    })
    .unwrap();
    let rules = rules_firing_at_once(&f.dir);
    let prom =
        Prometheus::start_with_rules(&f.addrs(), Some(stats_port), Some(&rules), &f.dir).unwrap();
    prom.wait_for("prefix_router_decisions", Duration::from_secs(30), |s| {
        !s.is_empty()
    })
    .unwrap();
    let firing = "ALERTS{alertname=\"PrefixRouterNotDeciding\",alertstate=\"firing\"}";
    assert!(
        prom.query(firing).unwrap().is_empty(),
        "fires before any traffic"
    );
    // every request fails the VM before it decides; Envoy keeps starting new ones
    let body = json!({"prompt": "hello", "max_tokens": 1});
    let fired = f.wait(Duration::from_secs(60), || {
        for _ in 0..5 {
            let a = f.send("/v1/completions", &body, &[("x-test-crash", "1")]);
            assert_ne!(a.status, 200, "{}", a.body);
        }
        !prom.query(firing).unwrap().is_empty()
    });
    assert!(fired, "PrefixRouterNotDeciding never fired");
}

/// The pods' panels and rules read one set of names (`pod:*`, labelled `pod`) whatever server
/// a pod runs: with llama.cpp pods (whose series are `llamacpp:*` and carry no `pod` label of
/// their own) every per-pod panel except the time-to-first-token one (llama.cpp has no such
/// histogram) shows each pod, and the prefix-cache hit rate sees the repeated prompt.
#[test]
fn the_pod_panels_show_llama_cpp_pods() {
    pod_panels_show_each_pod(
        PodKind::LlamaCpp,
        "llamacpp:prompt_tokens_total",
        "llamacpp:",
    );
}

/// The same with real vLLM pods (their own `vllm:*` series, labelled `model_name` and
/// `engine`, no `pod`): every per-pod panel, time to first token included, shows each pod.
#[test]
fn the_pod_panels_show_vllm_pods() {
    pod_panels_show_each_pod(PodKind::Vllm, "vllm:prompt_tokens_total", "vllm:");
}

/// Two pods of `kind` behind Envoy and a real Prometheus with the shipped rules: once
/// `first` has a series per pod and a prompt was repeated, every dashboard query over the
/// pods' series (`pod:*`, or the server's own names starting with `own`) shows each pod,
/// and the hit-rate rule sees the repeat.
fn pod_panels_show_each_pod(kind: PodKind, first: &str, own: &str) {
    let stats_port = free_port().unwrap();
    let name = format!("observability-{kind:?}").to_lowercase();
    let f = Fleet::start_of(kind, &name, 2, &[], |s| s.stats_port = Some(stats_port)).unwrap();
    let rules = rules_firing_at_once(&f.dir);
    let prom =
        Prometheus::start_with_rules(&f.addrs(), Some(stats_port), Some(&rules), &f.dir).unwrap();
    prom.wait_for(first, Duration::from_secs(30), |s| s.len() == 2)
        .unwrap();
    let long = json!({"model": MODEL_NAME, "prompt": format!("{LEAD}{LEAD}"), "max_tokens": 2});
    for _ in 0..4 {
        let a = f.send("/v1/completions", &long, &[]);
        assert_eq!(a.status, 200, "{}", a.body);
    }
    let dash: Value = serde_json::from_str(&observability("grafana-dashboard.json")).unwrap();
    let mut per_pod = 0;
    for panel in dash["panels"].as_array().unwrap() {
        let title = panel["title"].as_str().unwrap();
        for t in panel["targets"].as_array().unwrap() {
            let expr = t["expr"].as_str().unwrap();
            let pods_series = expr.starts_with("pod:") || expr.contains(own);
            if !pods_series {
                continue;
            }
            per_pod += 1;
            prom.wait_for(expr, Duration::from_secs(30), |s| {
                f.addrs()
                    .iter()
                    .all(|a| s.iter().any(|(l, _)| l.get("pod") == Some(a)))
            })
            .unwrap_or_else(|e| panic!("{title}: {expr}: {e}"));
        }
    }
    assert!(per_pod >= 5, "{per_pod} per-pod queries");
    // the repeated prompt was served from a pod's cache, and the rule sees it
    prom.wait_for(
        "max(pod:prefix_cache_hit_ratio:rate5m)",
        Duration::from_secs(30),
        |s| s.first().is_some_and(|x| x.1 > 0.0),
    )
    .unwrap();
}
