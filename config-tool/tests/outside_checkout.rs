//! The installed tool outside any checkout: run from an empty directory with a home of its
//! own, it finds the filter and the default model's tokenizer at the install location (where
//! `scripts/install.sh` puts them), renders a YAML-described gateway that a real Envoy
//! accepts, and names a bad field.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use std::path::{Path, PathBuf};
use std::process::Command;

fn checkout() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

const GATEWAY: &str = "\
listen: { port: 10000, stats_port: 9902 }
pools:
  - model: SmolLM2-135M-Instruct
    pods: [127.0.0.1:8001, 127.0.0.1:8002]
  - model: Qwen2.5-0.5B-Instruct
    pods: [127.0.0.1:9001]
    tokenizer_dir: QWEN_DIR
    block_size: 16
    adapters: [sql]
weights: { prefix: 6, inflight: 2 }
down_after_failures: 3
poll_interval_ms: 250
limits: { route_timeout: 600s, request_timeout: 30s }
inference_paths: { /v1/generate: completions }
";

#[test]
fn renders_a_gateway_file_anywhere_with_the_installed_filter() {
    let wasm = checkout().join("target/wasm32-wasip1/wasm/prefix_router_filter.wasm");
    assert!(
        wasm.is_file(),
        "build the filter first (scripts/build-filter.sh)"
    );
    let home = std::env::temp_dir().join(format!("prefix-router-install-{}", std::process::id()));
    let data = home.join(".local/share/prefix-router");
    std::fs::create_dir_all(&data).unwrap();
    let installed = data.join("prefix_router_filter.wasm");
    std::fs::copy(&wasm, &installed).unwrap();
    // the default model's tokenizer, as scripts/install.sh copies it
    let model = prefix_core::protocol::defaults::MODEL_NAME;
    let tokenizer = data.join("models").join(model);
    std::fs::create_dir_all(&tokenizer).unwrap();
    let setup = checkout().join("data/models").join(model);
    for f in ["tokenizer.json", "tokenizer_config.json"] {
        std::fs::copy(setup.join(f), tokenizer.join(f)).expect("scripts/setup.sh");
    }
    let qwen = checkout()
        .join("data/tokenizers/qwen2.5")
        .canonicalize()
        .unwrap();
    let gateway = GATEWAY.replace("QWEN_DIR", qwen.to_str().unwrap());
    std::fs::write(home.join("gateway.yaml"), &gateway).unwrap();
    let run = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_render-envoy-config"))
            .args(args)
            .current_dir(&home)
            .env_clear()
            .env("HOME", &home)
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .output()
            .unwrap()
    };
    let out = run(&["--config", "gateway.yaml", "-o", "envoy.yaml"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let yaml = std::fs::read_to_string(home.join("envoy.yaml")).unwrap();
    assert!(
        yaml.contains(installed.to_str().unwrap()),
        "the installed .wasm"
    );
    assert!(
        yaml.contains(tokenizer.join("tokenizer.json").to_str().unwrap()),
        "the installed tokenizer, served to the filter"
    );
    for part in [
        "pods_1",
        "\\\"block_size\\\":16",
        "\\\"down_after_failures\\\":3",
        "600s",
    ] {
        assert!(yaml.contains(part), "{part} in\n{yaml}");
    }
    // a real Envoy accepts it
    let envoy = std::env::var_os("ENVOY_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| checkout().join(".venv/bin/envoy"));
    let check = Command::new(envoy)
        .args(["--mode", "validate", "--disable-hot-restart", "-c"])
        .arg(home.join("envoy.yaml"))
        .output()
        .expect("Envoy (scripts/setup.sh)");
    assert!(
        check.status.success(),
        "{}",
        String::from_utf8_lossy(&check.stdout)
    );

    // a mistake is named by its path in the file, and by the filter's own validation
    std::fs::write(
        home.join("bad.yaml"),
        gateway.replace("block_size: 16", "block_size: lots"),
    )
    .unwrap();
    let out = run(&["--config", "bad.yaml"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("pools[1].block_size"),
        "{err}"
    );
    std::fs::write(
        home.join("bad.yaml"),
        gateway.replace("prefix: 6", "prefix: -6"),
    )
    .unwrap();
    let out = run(&["--config", "bad.yaml"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("weights.prefix"),
        "{err}"
    );
    // the simple case stays flags; an explicit --wasm is taken as given (it is where Envoy
    // runs, not necessarily here)
    let out = run(&[
        "--pods",
        "127.0.0.1:8001",
        "--wasm",
        "/etc/envoy/filter.wasm",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("/etc/envoy/filter.wasm"));
    let _ = std::fs::remove_dir_all(&home);
}
