//! Everything a request handler needs, built once at start-up from the validated config.

use crate::admission::Admission;
use crate::cache::Cache;
use crate::config::{Config, EngineKind};
use crate::metrics::Metrics;
use crate::sim::{SimCosts, SimEngine};
use anyhow::Context;
use gguf_engine::{Engine, GgufEngine};
use prefix_core::model::ModelFiles;
use prefix_core::{BlockSize, ModelBundle};
use std::sync::Arc;
use std::time::Duration;

pub struct AppState {
    pub config: Config,
    pub pod: String,
    pub bundle: Arc<ModelBundle>,
    pub cache: Arc<Cache>,
    pub engine: Arc<dyn Engine>,
    pub admission: Admission,
    /// Turns to tokenize a large body on a blocking thread: one fewer than the cores (at
    /// least one), so small requests always find a core ([`crate::api`]).
    pub large_turns: tokio::sync::Semaphore,
    pub metrics: Metrics,
}

/// Loads the tokenizer bundle named by the config.
pub fn load_bundle(config: &Config) -> anyhow::Result<ModelBundle> {
    let (json_path, cfg_path) = config.tokenizer_paths();
    let json = std::fs::read(&json_path).with_context(|| {
        format!(
            "reading tokenizer {} (run scripts/setup.sh, or pass --tokenizer)",
            json_path.display()
        )
    })?;
    let cfg = match &cfg_path {
        Some(p) => Some(std::fs::read(p).with_context(|| format!("reading {}", p.display()))?),
        None => None,
    };
    // Hugging Face's newer layout keeps the chat template in a file of its own
    let jinja_path = json_path.with_file_name("chat_template.jinja");
    let jinja = match jinja_path.is_file() {
        true => Some(
            std::fs::read(&jinja_path)
                .with_context(|| format!("reading {}", jinja_path.display()))?,
        ),
        false => None,
    };
    let block_size = BlockSize::new(config.block_size).context("invalid --block-size")?;
    let files = ModelFiles {
        tokenizer_json: &json,
        tokenizer_config_json: cfg.as_deref(),
        chat_template_jinja: jinja.as_deref(),
    };
    ModelBundle::from_files(&config.served_model_name, files, block_size)
        .map(|b| {
            b.with_adapters(config.lora_adapters.clone())
                .with_aliases(config.served_model_aliases.clone())
        })
        .with_context(|| format!("loading tokenizer {}", json_path.display()))
}

/// A per-process epoch: start time mixed with the process id, so a restart on the same
/// address is always recognised.
fn new_epoch() -> u64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    let mut bytes = nanos.to_le_bytes().to_vec();
    bytes.extend_from_slice(&std::process::id().to_le_bytes());
    xxhash_rust::xxh3::xxh3_64(&bytes).max(1)
}

impl AppState {
    pub fn new(config: Config) -> anyhow::Result<Arc<Self>> {
        config.validate()?;
        let bundle = Arc::new(load_bundle(&config)?);
        let pod = config.pod_name();
        let metrics = Metrics::new(
            &config.served_model_name,
            &pod,
            config.block_size,
            config.cache_blocks(),
        )?;
        let engine: Arc<dyn Engine> = match config.engine {
            EngineKind::Sim => Arc::new(SimEngine::new(SimCosts {
                ttft_base: Duration::from_secs_f64(config.sim_ttft_base_ms / 1e3),
                prefill_per_token: Duration::from_secs_f64(config.sim_prefill_us_per_token / 1e6),
                decode_per_token: Duration::from_secs_f64(config.sim_decode_ms_per_token / 1e3),
            })),
            EngineKind::Gguf => {
                let path = config
                    .model
                    .clone()
                    .unwrap_or_else(crate::config::default_model_file);
                let step_tokens = metrics.iteration_tokens.clone();
                Arc::new(
                    GgufEngine::load(&path, Arc::clone(&bundle), move |n| {
                        step_tokens.observe(n as f64)
                    })
                    .with_context(|| {
                        format!(
                            "loading {} (run scripts/setup.sh, or pass --model)",
                            path.display()
                        )
                    })?,
                )
            }
        };
        Ok(Arc::new(AppState {
            cache: Cache::with(
                config.cache_blocks(),
                config.block_size as usize,
                new_epoch(),
                engine.needs_kv(),
            ),
            admission: Admission::new(config.max_num_seqs, config.max_waiting),
            large_turns: tokio::sync::Semaphore::new(
                std::thread::available_parallelism()
                    .map_or(1, |n| n.get().saturating_sub(1).max(1)),
            ),
            pod,
            bundle,
            engine,
            metrics,
            config,
        }))
    }
}
