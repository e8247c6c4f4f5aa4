//! Where the project's binaries and data are, with environment overrides for each.

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

/// The model-server binary: the debug build that `cargo build` / the test script make;
/// `MODEL_SERVER_BIN` overrides (the benchmarks point it at the release build).
pub fn model_server_bin() -> PathBuf {
    env_path("MODEL_SERVER_BIN").unwrap_or_else(|| target_dir().join("debug/model-server"))
}

/// Prometheus (Debian package); `PROMETHEUS_BIN` overrides.
pub fn prometheus_bin() -> PathBuf {
    env_path("PROMETHEUS_BIN").unwrap_or_else(|| PathBuf::from("/usr/bin/prometheus"))
}

/// The templates in `envoy/`.
pub fn envoy_template_dir() -> PathBuf {
    repo_root().join("envoy")
}
