//! Renders `envoy/envoy.yaml.tmpl` for a given set of pods and ports.

use anyhow::{bail, Context};
use prefix_core::router_config::RouterConfig;
use serde_json::json;
use std::path::{Path, PathBuf};

/// Everything that varies between rendered configs.
#[derive(Debug, Clone)]
pub struct EnvoySettings {
    pub listen_port: u16,
    pub admin_port: u16,
    /// `ip:port` of every pod.
    pub pods: Vec<String>,
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
            wasm,
            block_size: 128,
            model_name: "SmolLM2-135M-Instruct".into(),
            max_body_bytes: 4 * 1024 * 1024,
            debug_headers: true,
            table_capacity: 65_536,
            policy: "prefix".into(),
            poll_interval_ms: 500,
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

fn fill(template: &str, vars: &[(&str, String)]) -> anyhow::Result<String> {
    let mut out = template.to_owned();
    for (k, v) in vars {
        out = out.replace(&format!("{{{{{k}}}}}"), v);
    }
    if let Some(i) = out.find("{{") {
        let rest: String = out[i..].chars().take(40).collect();
        bail!("unfilled placeholder in Envoy template: {rest}");
    }
    Ok(out)
}

/// Renders the config from the templates in `template_dir`.
pub fn render(settings: &EnvoySettings, template_dir: &Path) -> anyhow::Result<String> {
    let read = |name: &str| {
        std::fs::read_to_string(template_dir.join(name))
            .with_context(|| format!("reading {}", template_dir.join(name).display()))
    };
    // Validate exactly as the filter will, so a bad value fails here with the field named.
    let plugin = settings.plugin_config();
    if settings.wasm.is_some() {
        RouterConfig::parse(plugin.as_bytes())?;
    }
    let mut endpoints = String::new();
    for p in &settings.pods {
        let (host, port) = p
            .rsplit_once(':')
            .with_context(|| format!("pod '{p}' is not host:port"))?;
        endpoints.push_str(&format!(
            "        - endpoint: {{ address: {{ socket_address: {{ address: {host}, port_value: {port} }} }} }}\n"
        ));
    }
    let wasm_filter = match &settings.wasm {
        Some(path) => fill(
            &read("wasm-filter.yaml.tmpl")?,
            &[
                // single-quoted YAML scalar: double any single quote
                ("PLUGIN_CONFIG", plugin.replace('\'', "''")),
                ("WASM_PATH", path.display().to_string()),
            ],
        )?,
        None => String::new(),
    };
    fill(
        &read("envoy.yaml.tmpl")?,
        &[
            ("ADMIN_PORT", settings.admin_port.to_string()),
            ("LISTEN_PORT", settings.listen_port.to_string()),
            (
                "BUFFER_LIMIT",
                (settings.max_body_bytes + 64 * 1024).to_string(),
            ),
            ("WASM_FILTER", wasm_filter.trim_end().to_owned()),
            ("POD_ENDPOINTS", endpoints.trim_end().to_owned()),
        ],
    )
}
