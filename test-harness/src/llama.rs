//! llama.cpp's `llama-server` as a pod: the third-party server the tests and the llama.cpp
//! demo put behind Envoy, serving the same SmolLM2 GGUF as the project's own server.
//!
//! It has no cache-events endpoint: the filter follows it through `/health` and `/metrics`
//! (`--metrics`), and it reports its prompt-cache reuse in
//! `usage.prompt_tokens_details.cached_tokens` and `llamacpp:prompt_tokens_cached_total`.

use crate::paths;
use prefix_core::protocol::defaults::MODEL_NAME;
use std::process::Command;

/// Host-memory prompt cache per server, MiB (llama-server's default is 8 GiB).
pub const CACHE_RAM_MIB: u32 = 256;

/// The command for one `llama-server` on `127.0.0.1:port`, then `extra_args`: one slot and
/// one thread (a 2-core machine runs three of them), the model served under the name the
/// router's configuration uses.
pub fn command(port: u16, extra_args: &[&str]) -> anyhow::Result<Command> {
    let gguf = paths::default_gguf();
    if !gguf.is_file() {
        anyhow::bail!("{} missing (scripts/setup.sh)", gguf.display());
    }
    let mut cmd = Command::new(paths::llama_server_bin()?);
    cmd.arg("-m")
        .arg(gguf)
        .args(["--alias", MODEL_NAME, "--host", "127.0.0.1", "--port"])
        .arg(port.to_string())
        .args([
            "--metrics",
            "--no-webui",
            "--parallel",
            "1",
            "--threads",
            "1",
        ])
        .args(["--ctx-size", "4096", "--cache-ram"])
        .arg(CACHE_RAM_MIB.to_string())
        .args(extra_args);
    Ok(cmd)
}
