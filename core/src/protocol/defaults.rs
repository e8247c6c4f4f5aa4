//! Defaults that the filter, the model server and the harness must share: a router and its
//! pods hash the same blocks only when they agree on these.
//!
//! Self-contained (std only), so the filter's build script includes this very file to find
//! the tokenizer it embeds.

use std::path::{Path, PathBuf};

/// Tokens per prefix-cache block (vLLM's block size in the reference demo).
pub const BLOCK_SIZE: u32 = 128;

/// The model served (and hashed into every block's root) unless configured otherwise.
pub const MODEL_NAME: &str = "SmolLM2-135M-Instruct";

/// The default model's GGUF file name inside its model directory.
pub const MODEL_FILE: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";

/// Largest request body (bytes) buffered by the filter and read by the server.
pub const MAX_BODY_BYTES: usize = 4 * 1024 * 1024;

/// Prompt tokens a router reads by default (`max_prompt_tokens`): a long context's worth.
pub const MAX_PROMPT_TOKENS: usize = 32_768;

/// Bytes of prompt text a router reads per token of `max_prompt_tokens`: twice English's
/// ~4, so an ordinary prompt is cut by its token limit, never by this.
pub const READ_BYTES_PER_TOKEN: usize = 8;

/// The model server's flags that make its sim engine answer at once (tests and overhead
/// measurements start pods with them).
pub const SIM_ZERO_COST: [&str; 6] = [
    "--sim-ttft-base-ms",
    "0",
    "--sim-prefill-us-per-token",
    "0",
    "--sim-decode-ms-per-token",
    "0",
];

/// Environment variable naming the data directory, where `scripts/setup.sh` installs models.
pub const DATA_DIR_ENV: &str = "PREFIX_ROUTER_DATA";

/// The data directory: `$PREFIX_ROUTER_DATA`, else `<repo_root>/data`.
pub fn data_dir(repo_root: &Path) -> PathBuf {
    std::env::var_os(DATA_DIR_ENV)
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root.join("data"))
}

/// The default model's directory (GGUF, `tokenizer.json`, `tokenizer_config.json`).
pub fn model_dir(data_dir: &Path) -> PathBuf {
    data_dir.join("models").join(MODEL_NAME)
}
