//! Test support shared by the filter's unit tests.

use crate::host::fake::FakeHost;
use crate::metrics::Metrics;
use crate::models::{Model, Models};
use crate::router::Router;
use prefix_core::plugin_config::{PluginConfig, UnknownModel};
use prefix_core::router_config::RouterConfig;
use prefix_core::{BlockSize, ModelBundle};
use std::rc::Rc;

pub use prefix_core::model::tiny_tokenizer_json;

/// A bundle of [`tiny_tokenizer_json`].
pub fn tiny_bundle(block: u32) -> ModelBundle {
    ModelBundle::new(
        "m",
        tiny_tokenizer_json().as_bytes(),
        None,
        BlockSize::new(block).unwrap(),
    )
    .unwrap()
}

/// The bundle of the model `scripts/setup.sh` installs (SmolLM2's vocabulary and chat
/// template, read from the data directory) for `config`'s model name and block size: what
/// the filter builds once it has fetched those files.
pub fn installed_bundle(config: &RouterConfig) -> ModelBundle {
    use prefix_core::protocol::defaults::{data_dir, model_dir};
    let repo = std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/.."));
    let dir = model_dir(&data_dir(repo));
    let read = |name: &str| {
        std::fs::read(dir.join(name))
            .unwrap_or_else(|e| panic!("{}: {e} (run scripts/setup.sh)", dir.join(name).display()))
    };
    let cfg = read("tokenizer_config.json");
    ModelBundle::for_routing(
        &config.model_name,
        &read("tokenizer.json"),
        Some(&cfg),
        config.block_size,
    )
    .unwrap()
}

/// The pods of [`config`], in order.
pub const PODS: [&str; 3] = ["127.0.0.1:8001", "127.0.0.1:8002", "127.0.0.1:8003"];

/// Pods assumed to prefill instantly (the cost prior), so a routed prompt's blocks count as
/// its pod's from the next request on; tests of pending ownership set their own `cost`.
pub const INSTANT_PREFILL: &str = r#""cost":{"base_ms":0,"prefill_us_per_token":0}"#;

/// Three pods, 4-token blocks, model `m`, pods that prefill instantly ([`INSTANT_PREFILL`]),
/// plus `extra` config fields (a JSON object's inner text, e.g. `"debug_headers":true`).
pub fn config(extra: &str) -> RouterConfig {
    let fields = if extra.contains(r#""cost""#) {
        extra.to_owned()
    } else if extra.is_empty() {
        INSTANT_PREFILL.to_owned()
    } else {
        format!("{INSTANT_PREFILL},{extra}")
    };
    let json = format!(
        r#"{{"pods":["127.0.0.1:8001","127.0.0.1:8002","127.0.0.1:8003"],"block_size":4,"model_name":"m","table_capacity":4096,{fields}}}"#
    );
    RouterConfig::parse(json.as_bytes()).unwrap()
}

/// A router on [`config`] with the tiny tokenizer.
pub fn router(extra: &str) -> Router {
    Router::new(config(extra), Some(tiny_bundle(4)), 0)
}

/// One model, [`router`], as the filter's contexts see it.
pub fn models(host: &Rc<FakeHost>, extra: &str) -> Models<FakeHost> {
    models_of(host, router(extra))
}

/// One model served by `router`, as the filter's contexts see it (unknown models rejected).
pub fn models_of(host: &Rc<FakeHost>, router: Router) -> Models<FakeHost> {
    let config = PluginConfig {
        models: vec![router.config.clone()],
        unknown_model: UnknownModel::Reject,
        several: false,
    };
    let metrics = Metrics::define(
        Rc::clone(host),
        &router.config.model_name,
        &router.config.adapters,
    );
    Models {
        config,
        list: vec![Model {
            router: Rc::new(router),
            metrics: Rc::new(metrics),
        }],
    }
}
