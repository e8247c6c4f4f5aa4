//! Command-line configuration, validated once at start-up.

use clap::Parser;
use std::net::SocketAddr;
use std::path::PathBuf;

use prefix_core::protocol::defaults;
pub use prefix_core::protocol::defaults::MODEL_NAME as DEFAULT_MODEL_NAME;

/// Where `scripts/setup.sh` puts models: `$PREFIX_ROUTER_DATA`, else `<repo>/data`.
pub fn data_dir() -> PathBuf {
    defaults::data_dir(std::path::Path::new(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/.."
    )))
}

/// The default model directory (GGUF + tokenizer.json + tokenizer_config.json).
pub fn default_model_dir() -> PathBuf {
    defaults::model_dir(&data_dir())
}

/// Flags that make the sim engine answer at once (tests and overhead measurements).
pub use prefix_core::protocol::defaults::SIM_ZERO_COST;

/// The default model file that `scripts/setup.sh` installs.
pub fn default_model_file() -> PathBuf {
    default_model_dir().join(defaults::MODEL_FILE)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum EngineKind {
    /// Simulated latency model; no real inference.
    Sim,
    /// A Llama-architecture GGUF (SmolLM2 by default) on CPU with this project's kernels; the
    /// cache holds each block's real K/V. `candle` is its old name, still accepted.
    #[value(alias = "candle")]
    Gguf,
}

/// An OpenAI-compatible model server with a block prefix cache.
#[derive(Parser, Debug, Clone)]
#[command(name = "model-server", version, args_override_self = true)]
pub struct Config {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:8000")]
    pub listen: SocketAddr,
    /// Pod name used in metrics labels and the `x-inference-pod` header (default: the listen address).
    #[arg(long)]
    pub pod_name: Option<String>,
    /// Prefix-cache block size in tokens (must equal the router's).
    #[arg(long, default_value_t = defaults::BLOCK_SIZE)]
    pub block_size: u32,
    /// Prefix-cache capacity in blocks (0 disables the cache). Default: 4096 for `sim`, 256
    /// for `gguf`, where each block holds its K/V (≈ 5.6 MiB per block for SmolLM2-135M).
    #[arg(long)]
    pub cache_blocks: Option<usize>,
    /// Requests computed concurrently; the rest wait.
    #[arg(long, default_value_t = 8)]
    pub max_num_seqs: usize,
    /// Requests allowed to wait for a running slot; beyond that the server answers 429.
    #[arg(long, default_value_t = 256)]
    pub max_waiting: usize,
    /// Longest prompt in tokens.
    #[arg(long, default_value_t = 8192)]
    pub max_model_len: usize,
    /// Require `Authorization: Bearer <KEY>` on every /v1 path (401 otherwise), as vLLM's
    /// `--api-key`; /health, /metrics and /tokenize stay open, as there.
    #[arg(long)]
    pub api_key: Option<Secret>,
    /// Most prompts one completions request may batch (400 beyond).
    #[arg(long, default_value_t = 1024)]
    pub max_batch_prompts: usize,
    /// Largest request body in bytes (413 beyond).
    #[arg(long, default_value_t = defaults::MAX_BODY_BYTES)]
    pub max_body_bytes: usize,
    /// Tokens generated when a request sets no `max_tokens`.
    #[arg(long, default_value_t = 16)]
    pub default_max_tokens: u32,
    /// Inference engine.
    #[arg(long, value_enum, default_value_t = EngineKind::Sim)]
    pub engine: EngineKind,
    /// Name the model is served under (requests naming another model get 404).
    #[arg(long, default_value = DEFAULT_MODEL_NAME)]
    pub served_model_name: String,
    /// Other names the model is also served under (comma-separated; vLLM takes several
    /// `--served-model-name`s): requests naming one are served as the model's own, with the
    /// same cached blocks; `/v1/models` lists them all.
    #[arg(long, value_delimiter = ',')]
    pub served_model_aliases: Vec<String>,
    /// LoRA adapter names also served (comma-separated), for routing tests: requests may
    /// name them as `model`, and their prompts are cached apart from the base model's and
    /// each other's, as vLLM keys blocks by adapter. The sim engine only (no adapter weights
    /// are applied).
    #[arg(long, value_delimiter = ',')]
    pub lora_adapters: Vec<String>,
    /// Model file (GGUF) for `--engine gguf` (default: the SmolLM2 GGUF setup installs).
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// Tokenizer: a `tokenizer.json`, or a directory holding it (and optionally `tokenizer_config.json` with the chat template).
    #[arg(long)]
    pub tokenizer: Option<PathBuf>,
    /// sim: fixed time to first token, milliseconds. The sim defaults follow the real engine
    /// (`--engine gguf`, SmolLM2-135M, 2 CPU cores; `scripts/bench.sh engine`, 2026-12-05).
    #[arg(long, default_value_t = 100.0)]
    pub sim_ttft_base_ms: f64,
    /// sim: prefill cost per uncached prompt token, microseconds.
    #[arg(long, default_value_t = 3500.0)]
    pub sim_prefill_us_per_token: f64,
    /// sim: decode delay per generated token, milliseconds (one sequence decoding alone).
    #[arg(long, default_value_t = 10.0)]
    pub sim_decode_ms_per_token: f64,
}

/// A value never to be printed (an API key): its `Debug` says only that it is set.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(…)")
    }
}

impl std::str::FromStr for Secret {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        if s.is_empty() {
            return Err("must not be empty".into());
        }
        Ok(Secret(s.to_owned()))
    }
}

/// A configuration value that cannot work, naming the flag.
#[derive(Debug, thiserror::Error)]
#[error("invalid --{field}: {reason}")]
pub struct ConfigError {
    pub field: &'static str,
    pub reason: String,
}

impl Config {
    /// Checks the values that clap's types cannot.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let bad = |field, reason: &str| {
            Err(ConfigError {
                field,
                reason: reason.to_owned(),
            })
        };
        if self.block_size == 0 {
            return bad("block-size", "must be at least 1");
        }
        if self.max_num_seqs == 0 {
            return bad("max-num-seqs", "must be at least 1");
        }
        if self.max_model_len == 0 {
            return bad("max-model-len", "must be at least 1");
        }
        if self.max_batch_prompts == 0 {
            return bad("max-batch-prompts", "must be at least 1");
        }
        if self.max_body_bytes < 64 {
            return bad("max-body-bytes", "must be at least 64");
        }
        if self.default_max_tokens == 0 {
            return bad("default-max-tokens", "must be at least 1");
        }
        for (field, v) in [
            ("sim-ttft-base-ms", self.sim_ttft_base_ms),
            ("sim-prefill-us-per-token", self.sim_prefill_us_per_token),
            ("sim-decode-ms-per-token", self.sim_decode_ms_per_token),
        ] {
            if !(v.is_finite() && v >= 0.0) {
                return bad(field, "must be a finite number ≥ 0");
            }
        }
        if self.served_model_name.is_empty() {
            return bad("served-model-name", "must not be empty");
        }
        if !self.lora_adapters.is_empty() && self.engine != EngineKind::Sim {
            return bad(
                "lora-adapters",
                "needs --engine sim (the gguf engine applies no adapter weights)",
            );
        }
        Ok(())
    }

    /// The cache capacity in blocks, defaulted per engine.
    pub fn cache_blocks(&self) -> usize {
        self.cache_blocks.unwrap_or(match self.engine {
            EngineKind::Sim => 4096,
            EngineKind::Gguf => 256,
        })
    }

    pub fn pod_name(&self) -> String {
        self.pod_name
            .clone()
            .unwrap_or_else(|| self.listen.to_string())
    }

    /// The `(tokenizer.json, tokenizer_config.json?)` paths to load.
    pub fn tokenizer_paths(&self) -> (PathBuf, Option<PathBuf>) {
        let p = self.tokenizer.clone().unwrap_or_else(default_model_dir);
        let (json, dir) = if p.is_dir() {
            (p.join("tokenizer.json"), p)
        } else {
            let dir = p.parent().map(PathBuf::from).unwrap_or_default();
            (p, dir)
        };
        let cfg = dir.join("tokenizer_config.json");
        (json, cfg.is_file().then_some(cfg))
    }
}
