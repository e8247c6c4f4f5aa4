//! The model's tokenizer and chat template, embedded at build time (see `build.rs`): wasm in
//! Envoy cannot read files, and the vocabulary must be byte-for-byte the servers'.

use prefix_core::model::BundleError;
use prefix_core::router_config::RouterConfig;
use prefix_core::ModelBundle;

static TOKENIZER_JSON: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/tokenizer.json"));
static TOKENIZER_CONFIG_JSON: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/tokenizer_config.json"));

/// Builds the embedded model bundle for `config`'s model name and block size.
pub fn embedded_bundle(config: &RouterConfig) -> Result<ModelBundle, BundleError> {
    let cfg = (!TOKENIZER_CONFIG_JSON.is_empty()).then_some(TOKENIZER_CONFIG_JSON);
    ModelBundle::for_routing(&config.model_name, TOKENIZER_JSON, cfg, config.block_size)
}
