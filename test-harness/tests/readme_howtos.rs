//! The README's command blocks run as written: each is named (`<!-- howto: NAME -->`) and
//! either a test here runs it byte for byte (`howto("NAME")`) or CI's `scripts/test.sh` holds
//! its command lines. The blocks that start processes use the README's fixed ports, so they
//! run one at a time (nextest group `fixed-ports`).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;
use test_harness::cluster::client;
use test_harness::paths;
use test_harness::process::Proc;
use test_harness::readme::{blocks, howto, readme};

/// Blocks not run here, and why (a block leaving this list must be run, or the test fails).
const NOT_RUN: [(&str, &str); 1] = [
    (
        "kubernetes",
        "needs a container builder and a cluster; the manifests are checked offline by tests/kubernetes.rs",
    ),
];

/// A CI line runs `command` as written: it starts with it (after `exec`), followed by
/// nothing but a redirection or a `||`/`&&` tail.
fn ci_runs(ci: &str, command: &str) -> bool {
    ci.lines().any(|l| {
        let l = l.trim_start();
        let l = l.strip_prefix("exec ").unwrap_or(l);
        l.strip_prefix(command).is_some_and(|rest| {
            rest.is_empty()
                || [" >", " 2>", " ||", " &&", ">"]
                    .iter()
                    .any(|t| rest.starts_with(t))
        })
    })
}

#[test]
fn every_command_block_is_run_as_written() {
    let root = paths::repo_root();
    let mut sources = String::new();
    for dir in ["test-harness/tests", "config-tool/tests"] {
        for e in std::fs::read_dir(root.join(dir)).unwrap() {
            sources.push_str(&std::fs::read_to_string(e.unwrap().path()).unwrap_or_default());
        }
    }
    let ci = ["scripts/test.sh", ".ci/run"]
        .map(|f| std::fs::read_to_string(root.join(f)).unwrap())
        .join("\n");
    let mut names = Vec::new();
    for b in blocks(&readme()).into_iter().filter(|b| b.lang == "sh") {
        let name = b.name.unwrap_or_else(|| {
            panic!("README line {}: a shell block with no howto marker", b.line)
        });
        assert!(!names.contains(&name), "howto '{name}' named twice");
        names.push(name.clone());
        let by_test = sources.contains(&format!("howto(\"{name}\")"));
        let commands: Vec<&str> = b
            .text
            .lines()
            .map(|l| l.split(" #").next().unwrap_or(l).trim_end())
            .filter(|l| !l.trim().is_empty() && !l.trim_start().starts_with('#'))
            .collect();
        let by_ci = commands.iter().all(|c| ci_runs(&ci, c));
        let excused = NOT_RUN.iter().any(|(n, _)| *n == name);
        assert!(
            by_test || by_ci || excused,
            "README howto '{name}' (line {}) is run by no test and not by CI as written",
            b.line
        );
    }
    for (n, why) in NOT_RUN {
        assert!(
            names.iter().any(|m| m == n),
            "NOT_RUN names '{n}', which is gone ({why})"
        );
    }
}

/// Runs a README block with bash (errors stop it) in `dir`, with the installed tools first on
/// the PATH, in a process group that is stopped (with whatever it left running) on drop.
fn run_block(
    name: &str,
    text: String,
    dir: &Path,
    log_dir: &Path,
    timeout: Duration,
) -> (Proc, String) {
    run_block_with(name, text, dir, log_dir, timeout, &[])
}

/// [`run_block`] with more environment variables (this machine's settings, not the block's).
fn run_block_with(
    name: &str,
    text: String,
    dir: &Path,
    log_dir: &Path,
    timeout: Duration,
    env: &[(&str, &str)],
) -> (Proc, String) {
    assert!(!text.is_empty(), "no README howto '{name}'");
    let root = paths::repo_root();
    let bins = [
        root.join("target/debug"),
        root.join(".venv/bin"),
        paths::vllm_venv()
            .map(|v| v.join("bin"))
            .unwrap_or_default(),
        paths::llama_server_bin()
            .ok()
            .and_then(|p| p.parent().map(Path::to_path_buf))
            .unwrap_or_default(),
    ];
    let path = std::env::join_paths(bins.iter().cloned().chain(std::env::split_paths(
        &std::env::var_os("PATH").unwrap_or_default(),
    )))
    .unwrap();
    let mut cmd = Command::new("bash");
    cmd.args(["-euo", "pipefail", "-c", &text])
        .current_dir(dir)
        .env("PATH", path)
        .envs(env.iter().copied());
    let mut p = Proc::spawn_group(name, cmd, log_dir).unwrap();
    let mut status = None;
    let ended = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        poll(name, timeout, || {
            status = p.exited();
            status.is_some()
        })
    }));
    let log = std::fs::read_to_string(log_dir.join(format!("{name}.log"))).unwrap_or_default();
    match status {
        Some(s) if s.success() => (p, log),
        Some(s) => panic!("howto '{name}' failed ({s}):\n{log}"),
        None => panic!("howto '{name}' still running after {timeout:?} ({ended:?}):\n{log}"),
    }
}

/// Polls `check` every 50 ms until it holds; fails after `timeout`.
fn poll(what: &str, timeout: Duration, mut check: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + timeout;
    while !check() {
        assert!(
            std::time::Instant::now() < deadline,
            "{what}: not after {timeout:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn scratch(name: &str) -> PathBuf {
    let dir =
        std::env::temp_dir().join(format!("prefix-router-howto-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn validate(envoy_yaml: &Path) {
    let out = Command::new(paths::envoy_bin())
        .args(["--mode", "validate", "--disable-hot-restart", "-c"])
        .arg(envoy_yaml)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}: {}",
        envoy_yaml.display(),
        String::from_utf8_lossy(&out.stdout)
    );
}

#[test]
fn the_configuration_howtos_render_what_envoy_accepts() {
    let dir = scratch("config");
    // what the blocks name, as a user has it: the model directories
    let qwen = paths::repo_root().join("data/tokenizers/qwen2.5");
    for m in ["models/Qwen2.5-7B-Instruct", "models/qwen"] {
        std::fs::create_dir_all(dir.join(m)).unwrap();
        for f in ["tokenizer.json", "tokenizer_config.json"] {
            std::fs::copy(qwen.join(f), dir.join(m).join(f)).unwrap();
        }
    }
    for (name, text, outputs) in [
        (
            "pods-that-come-and-go",
            howto("pods-that-come-and-go"),
            &["envoy.yaml", "envoy-dns.yaml"][..],
        ),
        ("another-model", howto("another-model"), &["envoy.yaml"][..]),
        (
            "several-models",
            howto("several-models"),
            &["envoy.yaml"][..],
        ),
        (
            "pod-credentials-and-tls",
            howto("pod-credentials-and-tls"),
            &[][..],
        ),
        (
            "render-gateway-file",
            howto("render-gateway-file"),
            &["envoy.yaml"][..],
        ),
    ] {
        if name == "render-gateway-file" {
            std::fs::write(dir.join("gateway.yaml"), howto("gateway-yaml")).unwrap();
        }
        let _ = std::fs::remove_file(dir.join("envoy.yaml"));
        let (_p, _) = run_block(name, text, &dir, &dir.join("logs"), Duration::from_secs(60));
        for o in outputs {
            validate(&dir.join(o));
        }
        if name == "pod-credentials-and-tls" {
            let yaml = std::fs::read_to_string(dir.join("envoy.yaml")).unwrap();
            assert!(yaml.contains("pods.example.internal") && yaml.contains("client.crt"));
            assert!(yaml.contains("POD_API_KEY"));
        }
        if name == "render-gateway-file" {
            let yaml = std::fs::read_to_string(dir.join("envoy.yaml")).unwrap();
            assert!(
                yaml.contains("0.0.0.0")
                    && yaml.contains("/v1/generate")
                    && yaml.contains("qwen-sql")
            );
        }
        if name == "several-models" {
            let yaml = std::fs::read_to_string(dir.join("envoy.yaml")).unwrap();
            assert!(yaml.contains("qwen-sql") && yaml.contains("pods_1"));
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// The two ways of starting pods and Envoy by hand, on the README's own ports: each answers
/// through the listener and routes a repeated prompt by prefix.
#[test]
fn the_by_hand_howtos_serve_through_envoy() {
    let http = client();
    let prompt = serde_json::json!({"model": "SmolLM2-135M-Instruct",
        "prompt": "Summarise the runbook: confirm the service, region, alert time and error rate. ".repeat(12),
        "max_tokens": 1});
    // the repeat goes to the pod that cached the prompt: its answer counts cached tokens
    let repeated = |pods: &str| {
        let send = || {
            let r = http
                .post("http://127.0.0.1:10000/v1/completions")
                .json(&prompt)
                .send()
                .unwrap();
            let a = test_harness::fleet::Answer::read(r);
            assert_eq!(a.status, 200, "{pods}: {}", a.body);
            a.cached()
        };
        send();
        let cached = send();
        assert!(
            cached >= 128,
            "{pods}: the repeat found {cached} cached tokens"
        );
    };

    // each of Envoy's VMs fetches the tokenizer just after start (balanced by load until then)
    let tokenizer_loaded = || test_harness::cluster::tokenizers_tried(&http, 9901, 1);
    let dir = scratch("by-hand");
    let (mut p, out) = run_block(
        "by-hand",
        howto("by-hand"),
        &paths::repo_root(),
        &dir,
        Duration::from_secs(600),
    );
    assert!(out.contains("\"object\": \"text_completion\""), "{out}");
    assert!(
        out.contains("chat.completion.chunk") && out.contains("[DONE]"),
        "{out}"
    );
    assert!(out.contains("\"block_hashes\""), "{out}");
    poll(
        "the filter's tokenizer",
        Duration::from_secs(60),
        tokenizer_loaded,
    );
    repeated("model-server pods");
    p.kill();

    let gguf_dir = paths::default_gguf().parent().unwrap().to_path_buf();
    let (mut p, _) = run_block(
        "llama-cpp-pods",
        howto("llama-cpp-pods"),
        &gguf_dir,
        &dir,
        Duration::from_secs(120),
    );
    let ready = || {
        http.get("http://127.0.0.1:9901/ready")
            .send()
            .is_ok_and(|r| r.status() == 200)
    };
    poll("envoy ready", Duration::from_secs(60), ready);
    poll(
        "the filter's tokenizer",
        Duration::from_secs(60),
        tokenizer_loaded,
    );
    let pods_ready = || {
        (8001..=8003).all(|port| {
            http.get(format!("http://127.0.0.1:{port}/health"))
                .send()
                .is_ok_and(|r| r.status() == 200)
        })
    };
    poll("llama-server ready", Duration::from_secs(60), pods_ready);
    repeated("llama.cpp pods");
    p.kill();
    let _ = std::fs::remove_dir_all(&dir);
}

/// The vLLM how-to on the README's ports: a real vLLM serving the model directory with its
/// events published, its kv-events sidecar serving them (ready once subscribed and vLLM's
/// `/metrics` answers), and the Envoy configuration asking that sidecar.
#[test]
fn the_vllm_howto_serves_its_events() {
    let dir = scratch("vllm");
    // this machine's CPU settings for vLLM (a GPU box needs none)
    let cpu = [
        ("VLLM_CPU_KVCACHE_SPACE", "1"),
        ("VLLM_CPU_OMP_THREADS_BIND", "nobind"),
        ("OMP_NUM_THREADS", "1"),
        ("HF_HUB_OFFLINE", "1"),
        ("VLLM_NO_USAGE_STATS", "1"),
    ];
    let (mut p, _) = run_block_with(
        "vllm-pods",
        howto("vllm-pods"),
        &paths::repo_root(),
        &dir,
        Duration::from_secs(60),
        &cpu,
    );
    let config = std::fs::read_to_string("/tmp/envoy.yaml").unwrap();
    assert!(
        config.contains("127.0.0.1:8101"),
        "the sidecar's address in the filter's config"
    );
    let http = client();
    let log = dir.join("vllm-pods.log");
    let serving = || {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        assert!(!text.contains("Traceback"), "vLLM failed:\n{text}");
        http.get("http://127.0.0.1:8101/health")
            .send()
            .is_ok_and(|r| r.status() == 200)
    };
    poll("the vLLM pod's sidecar", Duration::from_secs(300), serving);
    let page: serde_json::Value = http
        .get("http://127.0.0.1:8101/v1/cache/events?since=0")
        .send()
        .unwrap()
        .json()
        .unwrap();
    assert!(
        page.get("generation").is_some() || page.get("events").is_some(),
        "{page}"
    );
    p.kill();
    let _ = std::fs::remove_dir_all(&dir);
}
