//! An external load generator nobody here wrote: inference-perf (PyPI; the Kubernetes
//! serving working group's benchmark tool), driving each front with its own shared-prefix
//! workload (random-token system prompts in groups, its own tokenizer counting, its own
//! latency statistics), so the comparison does not rest only on traces the policy was tuned
//! on. It runs from the venv `scripts/install-peers.sh` makes (Python ≥ 3.12), offline, with
//! the installed model's tokenizer directory.

use anyhow::Context;
use serde::Serialize;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::Command;

/// One inference-perf workload: `groups` system prompts of `system_prompt_len` tokens, each
/// with its own questions, sent closed-loop by `concurrency` clients.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct IpWorkload {
    /// the run's workload name in the tables
    pub name: &'static str,
    pub groups: u32,
    pub system_prompt_len: u32,
    pub question_len: u32,
    pub output_len: u32,
    pub requests: usize,
    pub concurrency: usize,
    /// each pod's prefix-cache capacity, in blocks
    pub cache_blocks: usize,
}

/// What inference-perf reported of one run (its summary; seconds turned into ms).
#[derive(Debug, Clone, Default, Serialize)]
pub struct IpSummary {
    pub ok: usize,
    pub errors: usize,
    pub duration_s: f64,
    pub ttft_ms: [f64; 3],
    pub e2e_ms: [f64; 3],
    pub output_tokens: f64,
}

/// The launcher: `$INFERENCE_PERF_BIN`, else the venv setup made.
pub fn bin() -> PathBuf {
    if let Some(p) = std::env::var_os("INFERENCE_PERF_BIN") {
        return PathBuf::from(p);
    }
    let home = std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_default();
    home.join(".cache/prefix-router/peers/inference-perf/bin/inference-perf")
}

pub fn installed() -> bool {
    bin().is_file()
}

/// The run's configuration (JSON, which its YAML reader takes as is).
pub fn config(w: &IpWorkload, base_url: &str, tokenizer_dir: &Path, out: &Path) -> Value {
    let per_group = (w.requests as u32).div_ceil(w.groups.max(1));
    json!({
        "api": {"type": "completion", "streaming": true},
        "data": {"type": "shared_prefix", "shared_prefix": {
            "num_groups": w.groups, "num_prompts_per_group": per_group,
            "system_prompt_len": w.system_prompt_len, "question_len": w.question_len,
            "output_len": w.output_len, "seed": 42}},
        "load": {"type": "concurrent", "num_workers": 2,
                 "stages": [{"num_requests": w.requests, "concurrency_level": w.concurrency}],
                 "request_timeout": 60},
        "server": {"type": "vllm", "model_name": prefix_core::protocol::defaults::MODEL_NAME,
                   "base_url": base_url, "ignore_eos": true},
        "tokenizer": {"pretrained_model_name_or_path": tokenizer_dir},
        "report": {"request_lifecycle": {"summary": true, "per_stage": false, "per_request": false},
                   "prometheus": null},
        "storage": {"local_storage": {"path": out}},
    })
}

/// Runs inference-perf against `base_url` (loopback only); its files go to `dir`.
pub fn run(w: &IpWorkload, base_url: &str, dir: &Path) -> anyhow::Result<IpSummary> {
    if !base_url.starts_with("http://127.0.0.1:") {
        anyhow::bail!("load is only ever sent to 127.0.0.1");
    }
    let out = dir.join("inference-perf");
    let cfg = dir.join("inference-perf.yaml");
    let tokenizer = model_server::config::default_model_dir();
    std::fs::write(
        &cfg,
        serde_json::to_vec_pretty(&config(w, base_url, &tokenizer, &out))?,
    )?;
    let log = std::fs::File::create(dir.join("inference-perf.log"))?;
    let status = Command::new(bin())
        .arg("-c")
        .arg(&cfg)
        .env("HF_HUB_OFFLINE", "1")
        .env("TRANSFORMERS_OFFLINE", "1")
        .stdout(log.try_clone()?)
        .stderr(log)
        .status()
        .with_context(|| format!("running {}", bin().display()))?;
    if !status.success() {
        anyhow::bail!(
            "inference-perf failed ({status}); see {}",
            dir.join("inference-perf.log").display()
        );
    }
    let path = out.join("summary_lifecycle_metrics.json");
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    summary(&serde_json::from_str(&text)?)
}

/// Reads the numbers the comparison uses out of inference-perf's summary.
pub fn summary(v: &Value) -> anyhow::Result<IpSummary> {
    let ok = &v["successes"];
    let ms = |metric: &str| -> [f64; 3] {
        let m = &ok["latency"][metric];
        ["median", "p90", "p99"].map(|q| m[q].as_f64().unwrap_or(f64::NAN) * 1000.0)
    };
    Ok(IpSummary {
        ok: ok["count"]
            .as_u64()
            .context("no successes.count in inference-perf's summary")? as usize,
        errors: v["failures"]["count"].as_u64().unwrap_or(0) as usize,
        duration_s: v["benchmark_time_seconds"].as_f64().unwrap_or(f64::NAN),
        ttft_ms: ms("time_to_first_token"),
        e2e_ms: ms("request_latency"),
        output_tokens: ok["output_tokens"]["total"].as_f64().unwrap_or(0.0),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_summary_it_writes() {
        let v = json!({"benchmark_time_seconds": 2.0,
            "successes": {"count": 10, "output_tokens": {"total": 40.0},
                "latency": {"time_to_first_token": {"median": 0.01, "p90": 0.02, "p99": 0.03},
                            "request_latency": {"median": 0.1, "p90": 0.2, "p99": 0.3}}},
            "failures": {"count": 1}});
        let s = summary(&v).unwrap();
        assert_eq!((s.ok, s.errors, s.duration_s), (10, 1, 2.0));
        assert_eq!(s.ttft_ms, [10.0, 20.0, 30.0]);
        assert!((s.e2e_ms[2] - 300.0).abs() < 1e-9);
        assert!(summary(&json!({})).is_err());
    }
}
