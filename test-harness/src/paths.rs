//! Where the project's binaries and data are, with environment overrides for each.

use prefix_core::protocol::defaults;
use std::path::PathBuf;

fn env_path(var: &str) -> Option<PathBuf> {
    std::env::var_os(var).map(PathBuf::from)
}

/// The repository root.
pub fn repo_root() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
}

fn target_dir() -> PathBuf {
    env_path("CARGO_TARGET_DIR").unwrap_or_else(|| repo_root().join("target"))
}

/// Envoy from the project venv (`scripts/setup.sh`); `ENVOY_BIN` overrides.
pub fn envoy_bin() -> PathBuf {
    env_path("ENVOY_BIN").unwrap_or_else(|| repo_root().join(".venv/bin/envoy"))
}

/// The release-built filter (`scripts/build-filter.sh`); `PREFIX_ROUTER_WASM` overrides.
pub fn wasm_path() -> PathBuf {
    env_path("PREFIX_ROUTER_WASM")
        .unwrap_or_else(|| target_dir().join("wasm32-wasip1/wasm/prefix_router_filter.wasm"))
}

/// The filter built with the `tokenizers` crate inside, for any `tokenizer.json`
/// (`scripts/build-filter.sh --full`).
pub fn full_wasm_path() -> PathBuf {
    target_dir().join("wasm32-wasip1/wasm/prefix_router_filter_full.wasm")
}

/// The model-server binary: the debug build that `cargo build` / the test script make;
/// `MODEL_SERVER_BIN` overrides (the benchmarks point it at the release build).
pub fn model_server_bin() -> PathBuf {
    env_path("MODEL_SERVER_BIN").unwrap_or_else(|| target_dir().join("debug/model-server"))
}

/// Prometheus (Debian package); `PROMETHEUS_BIN` overrides.
pub fn prometheus_bin() -> PathBuf {
    env_path("PROMETHEUS_BIN").unwrap_or_else(|| PathBuf::from("/usr/bin/prometheus"))
}

/// Prometheus's `promtool` (same Debian package); `PROMTOOL_BIN` overrides.
pub fn promtool_bin() -> PathBuf {
    env_path("PROMTOOL_BIN").unwrap_or_else(|| PathBuf::from("/usr/bin/promtool"))
}

/// `kubernetes-validate` (PyPI, Kubernetes JSON schemas) from the project venv.
pub fn kubernetes_validate_bin() -> PathBuf {
    env_path("KUBERNETES_VALIDATE_BIN")
        .unwrap_or_else(|| repo_root().join(".venv/bin/kubernetes-validate"))
}

/// llama.cpp's `llama-server`: `LLAMA_SERVER_BIN` overrides; otherwise the path
/// `scripts/build-llama-server.sh` prints (it builds the binary into a cache outside the clone
/// the first time, and only prints the path after that), asked once per process.
pub fn llama_server_bin() -> anyhow::Result<PathBuf> {
    static BIN: std::sync::OnceLock<Result<PathBuf, String>> = std::sync::OnceLock::new();
    if let Some(p) = env_path("LLAMA_SERVER_BIN") {
        return Ok(p);
    }
    BIN.get_or_init(|| script_output("scripts/build-llama-server.sh"))
        .clone()
        .map_err(anyhow::Error::msg)
}

/// Runs one of the project's install scripts, which prints the path it installed to.
fn script_output(script: &str) -> Result<PathBuf, String> {
    let script = repo_root().join(script);
    let out = std::process::Command::new("bash")
        .arg(&script)
        .stderr(std::process::Stdio::inherit())
        .output()
        .map_err(|e| format!("running {}: {e}", script.display()))?;
    let path = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    if !out.status.success() || path.is_empty() {
        return Err(format!("{} failed ({})", script.display(), out.status));
    }
    Ok(PathBuf::from(path))
}

/// The kv-events sidecar (the debug build the test script makes); `KV_EVENTS_BIN` overrides.
pub fn kv_events_bin() -> PathBuf {
    env_path("KV_EVENTS_BIN").unwrap_or_else(|| target_dir().join("debug/kv-events"))
}

/// vLLM's venv: `VLLM_VENV` overrides; otherwise the path `scripts/install-vllm.sh` prints (it
/// installs vLLM into a cache outside the clone the first time), asked once per process.
pub fn vllm_venv() -> anyhow::Result<PathBuf> {
    static VENV: std::sync::OnceLock<Result<PathBuf, String>> = std::sync::OnceLock::new();
    if let Some(p) = env_path("VLLM_VENV") {
        return Ok(p);
    }
    VENV.get_or_init(|| script_output("scripts/install-vllm.sh"))
        .clone()
        .map_err(anyhow::Error::msg)
}

/// Where `scripts/setup.sh` puts models: `$PREFIX_ROUTER_DATA`, else `<repo>/data`.
pub fn data_dir() -> PathBuf {
    defaults::data_dir(&repo_root())
}

/// The default model's directory (GGUF, `tokenizer.json`, `tokenizer_config.json`).
pub fn default_model_dir() -> PathBuf {
    defaults::model_dir(&data_dir())
}

/// SmolLM2 in the Hugging Face layout vLLM loads (`scripts/setup.sh` writes it).
pub fn vllm_model_dir() -> PathBuf {
    data_dir().join("models").join(format!(
        "{}-hf",
        prefix_core::protocol::defaults::MODEL_NAME
    ))
}

/// The default model's GGUF file (`scripts/setup.sh` installs it).
pub fn default_gguf() -> PathBuf {
    default_model_dir().join(defaults::MODEL_FILE)
}
