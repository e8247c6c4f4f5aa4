//! Renders `envoy/envoy.yaml.j2` (minijinja) for a given set of pods and ports.

use anyhow::Context;
use prefix_core::policy::MAX_FALLBACKS;
use prefix_core::protocol::defaults;
use prefix_core::router_config::{RouterConfig, DEFAULT_POLL_INTERVAL_MS, DEFAULT_TABLE_CAPACITY};
use serde_json::json;
use std::path::{Path, PathBuf};

/// Everything that varies between rendered configs.
#[derive(Debug, Clone)]
pub struct EnvoySettings {
    pub listen_port: u16,
    pub admin_port: u16,
    /// `ip:port` of every pod the filter knows (plugin configuration).
    pub pods: Vec<String>,
    /// Members of Envoy's `pods` cluster, when they differ from `pods` (`None`: the same).
    pub members: Option<Vec<String>>,
    /// The filter; `None` renders Envoy without it (plain round-robin, for comparisons).
    pub wasm: Option<PathBuf>,
    pub block_size: u32,
    pub model_name: String,
    pub max_body_bytes: usize,
    pub debug_headers: bool,
    pub table_capacity: u64,
    /// `prefix`, `round_robin`, `random` or `least_loaded`.
    pub policy: String,
    pub poll_interval_ms: u64,
    /// Extra plugin-config fields merged in as-is (e.g. `weights`).
    pub extra: serde_json::Map<String, serde_json::Value>,
}

impl EnvoySettings {
    pub fn new(
        listen_port: u16,
        admin_port: u16,
        pods: Vec<String>,
        wasm: Option<PathBuf>,
    ) -> Self {
        EnvoySettings {
            listen_port,
            admin_port,
            pods,
            members: None,
            wasm,
            block_size: defaults::BLOCK_SIZE,
            model_name: defaults::MODEL_NAME.into(),
            max_body_bytes: defaults::MAX_BODY_BYTES,
            debug_headers: true,
            table_capacity: DEFAULT_TABLE_CAPACITY,
            policy: "prefix".into(),
            poll_interval_ms: DEFAULT_POLL_INTERVAL_MS,
            extra: serde_json::Map::new(),
        }
    }

    /// The filter's plugin configuration JSON.
    pub fn plugin_config(&self) -> String {
        let mut v = json!({
            "pods": self.pods,
            "block_size": self.block_size,
            "model_name": self.model_name,
            "max_body_bytes": self.max_body_bytes,
            "debug_headers": self.debug_headers,
            "table_capacity": self.table_capacity,
            "policy": self.policy,
            "poll_interval_ms": self.poll_interval_ms,
        });
        if let Some(obj) = v.as_object_mut() {
            obj.extend(self.extra.clone());
        }
        v.to_string()
    }
}

/// The Envoy template's name in [`crate::paths::envoy_template_dir`].
pub const TEMPLATE: &str = "envoy.yaml.j2";

/// Renders the config from the template in `template_dir`, after validating the plugin
/// configuration exactly as the filter will (a bad value fails here, with the field named).
pub fn render(settings: &EnvoySettings, template_dir: &Path) -> anyhow::Result<String> {
    if settings.wasm.is_some() {
        RouterConfig::parse(settings.plugin_config().as_bytes())?;
    }
    render_unchecked(settings, template_dir)
}

/// Renders without validating the plugin configuration: only for proving that Envoy itself
/// refuses a bad one.
pub fn render_unchecked(settings: &EnvoySettings, template_dir: &Path) -> anyhow::Result<String> {
    let path = template_dir.join(TEMPLATE);
    let template =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let plugin = settings.plugin_config();
    let mut members = Vec::new();
    for p in settings.members.as_ref().unwrap_or(&settings.pods) {
        let addr: std::net::SocketAddr = p
            .parse()
            .with_context(|| format!("pod '{p}' is not ip:port"))?;
        members.push(json!({"host": addr.ip().to_string(), "port": addr.port()}));
    }
    let mut env = minijinja::Environment::new();
    env.set_undefined_behavior(minijinja::UndefinedBehavior::Strict);
    env.add_template(TEMPLATE, &template)?;
    let yaml = env.get_template(TEMPLATE)?.render(json!({
        "admin_port": settings.admin_port,
        "listen_port": settings.listen_port,
        "buffer_limit": settings.max_body_bytes + 64 * 1024,
        "plugin_config": plugin,
        "wasm_path": settings.wasm.as_ref().map(|p| p.display().to_string()),
        "members": members,
        // the chosen pod, each fallback, then one try by plain balancing
        "num_retries": MAX_FALLBACKS + 1,
    }))?;
    Ok(yaml)
}
