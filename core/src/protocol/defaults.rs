//! Defaults that the filter, the model server and the harness must share: a router and its
//! pods hash the same blocks only when they agree on these.

pub use crate::block::DEFAULT_BLOCK_SIZE as BLOCK_SIZE;

/// The model served (and hashed into every block's root) unless configured otherwise.
pub const MODEL_NAME: &str = "SmolLM2-135M-Instruct";

/// The default model's GGUF file name inside its model directory.
pub const MODEL_FILE: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";

/// Largest request body (bytes) buffered by the filter and read by the server.
pub const MAX_BODY_BYTES: usize = 4 * 1024 * 1024;

/// Environment variable naming the data directory (`<repo>/data` otherwise), where
/// `scripts/setup.sh` installs models.
pub const DATA_DIR_ENV: &str = "PREFIX_ROUTER_DATA";

/// The default model's directory under the data directory.
pub fn model_dir(data_dir: &std::path::Path) -> std::path::PathBuf {
    data_dir.join("models").join(MODEL_NAME)
}
