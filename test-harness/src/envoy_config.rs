//! Renders `envoy/envoy.yaml.j2` (minijinja) for a given set of pods and ports.

use anyhow::Context;
use prefix_core::policy::MAX_FALLBACKS;
use prefix_core::protocol::defaults;
use prefix_core::router_config::{RouterConfig, DEFAULT_POLL_INTERVAL_MS, DEFAULT_TABLE_CAPACITY};
use serde_json::json;
use std::path::{Path, PathBuf};

/// Where the `pods` cluster's members come from.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Membership {
    /// A STATIC cluster of `pods` (ip:port), and the same fixed list in the plugin config.
    #[default]
    Static,
    /// A STRICT_DNS cluster of `pods` (`name:port`, e.g. a Kubernetes headless Service); the
    /// filter follows the resolved members through Envoy's admin (`discovery`).
    Dns,
    /// An EDS cluster fed from this watched file ([`write_eds`]); the filter follows it
    /// through Envoy's admin.
    EdsFile(PathBuf),
}

/// Everything that varies between rendered configs.
#[derive(Debug, Clone)]
pub struct EnvoySettings {
    /// Address of the inference (and stats) listeners: 127.0.0.1 unless deployed (a pod's
    /// 0.0.0.0). The admin always stays on 127.0.0.1.
    pub listen_address: String,
    pub listen_port: u16,
    /// A listener serving only `/stats/prometheus` and `/ready` from the admin.
    pub stats_port: Option<u16>,
    /// A Hugging Face–style model directory (`tokenizer.json`, optional
    /// `tokenizer_config.json`) that Envoy serves on `assets_port` (loopback) for the filter
    /// to fetch at start, instead of the tokenizer built into the .wasm.
    pub tokenizer_dir: Option<PathBuf>,
    /// `tokenizer_dir` exists only where Envoy runs (a Kubernetes pod's volume): it is not
    /// looked at here, and is taken to hold both files.
    pub tokenizer_dir_remote: bool,
    pub assets_port: u16,
    pub admin_port: u16,
    /// `ip:port` of every pod the filter knows (plugin configuration).
    pub pods: Vec<String>,
    /// Members of Envoy's `pods` cluster, when they differ from `pods` (`None`: the same).
    pub members: Option<Vec<String>>,
    /// Where the cluster's members come from.
    pub membership: Membership,
    /// STRICT_DNS re-resolution period.
    pub dns_refresh: String,
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
            listen_address: "127.0.0.1".into(),
            listen_port,
            stats_port: None,
            tokenizer_dir: None,
            tokenizer_dir_remote: false,
            assets_port: 9903,
            admin_port,
            pods,
            members: None,
            membership: Membership::Static,
            dns_refresh: "5s".into(),
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

    /// The files Envoy serves from `tokenizer_dir`: `tokenizer.json` and, when there is one,
    /// `tokenizer_config.json` (both assumed in a directory that exists only where Envoy
    /// runs). An error when a local directory has no `tokenizer.json`.
    pub fn tokenizer_files(&self) -> anyhow::Result<Option<(PathBuf, Option<PathBuf>)>> {
        let Some(dir) = &self.tokenizer_dir else {
            return Ok(None);
        };
        if self.tokenizer_dir_remote {
            return Ok(Some((
                dir.join("tokenizer.json"),
                Some(dir.join("tokenizer_config.json")),
            )));
        }
        let dir = std::path::absolute(dir)?;
        let json = dir.join("tokenizer.json");
        if !json.is_file() {
            anyhow::bail!("no tokenizer.json in {}", dir.display());
        }
        let cfg = dir.join("tokenizer_config.json");
        Ok(Some((json, cfg.is_file().then_some(cfg))))
    }

    /// The filter's plugin configuration JSON.
    pub fn plugin_config(&self) -> String {
        let pods = match self.membership {
            Membership::Static => json!(self.pods),
            // the filter learns them from Envoy
            Membership::Dns | Membership::EdsFile(_) => json!([]),
        };
        let mut v = json!({
            "pods": pods,
            "block_size": self.block_size,
            "model_name": self.model_name,
            "max_body_bytes": self.max_body_bytes,
            "debug_headers": self.debug_headers,
            "table_capacity": self.table_capacity,
            "policy": self.policy,
            "poll_interval_ms": self.poll_interval_ms,
        });
        if let Some(obj) = v.as_object_mut() {
            if let Ok(Some((_, cfg))) = self.tokenizer_files() {
                let cfg = cfg.is_some();
                obj.insert(
                    "tokenizer".into(),
                    json!({"cluster": ASSETS_CLUSTER,
                           "config_path": cfg.then_some("/tokenizer_config.json")}),
                );
            }
            if self.membership != Membership::Static {
                obj.insert("discovery".into(), json!({}));
            }
            obj.extend(self.extra.clone());
        }
        v.to_string()
    }
}

/// The cluster (and loopback listener) through which Envoy serves the tokenizer files.
pub const ASSETS_CLUSTER: &str = "prefix_router_assets";

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
        let (host, port) = match settings.membership {
            Membership::Dns => {
                let (host, port) = p
                    .rsplit_once(':')
                    .with_context(|| format!("pod '{p}' is not name:port"))?;
                let port: u16 = port
                    .parse()
                    .with_context(|| format!("pod '{p}': bad port"))?;
                (host.to_owned(), port)
            }
            _ => {
                let addr: std::net::SocketAddr = p
                    .parse()
                    .with_context(|| format!("pod '{p}' is not ip:port"))?;
                (addr.ip().to_string(), addr.port())
            }
        };
        members.push(json!({"host": host, "port": port}));
    }
    let (membership, eds_path, eds_dir) = match &settings.membership {
        Membership::Static => ("static", None, None),
        Membership::Dns => ("dns", None, None),
        Membership::EdsFile(p) => (
            "eds",
            Some(p.display().to_string()),
            p.parent().map(|d| d.display().to_string()),
        ),
    };
    let (tokenizer_json, tokenizer_config) = match settings.tokenizer_files()? {
        Some((json, cfg)) => (
            Some(json.display().to_string()),
            cfg.map(|c| c.display().to_string()),
        ),
        None => (None, None),
    };
    let mut env = minijinja::Environment::new();
    env.set_undefined_behavior(minijinja::UndefinedBehavior::Strict);
    env.add_template(TEMPLATE, &template)?;
    let yaml = env.get_template(TEMPLATE)?.render(json!({
        "admin_port": settings.admin_port,
        "listen_port": settings.listen_port,
        "listen_address": settings.listen_address,
        "stats_port": settings.stats_port,
        "buffer_limit": settings.max_body_bytes + 64 * 1024,
        "plugin_config": plugin,
        "wasm_path": settings.wasm.as_ref().map(|p| p.display().to_string()),
        "members": members,
        "membership": membership,
        "discovery": settings.wasm.is_some() && settings.membership != Membership::Static,
        "eds_path": eds_path,
        "eds_dir": eds_dir,
        "dns_refresh": settings.dns_refresh,
        "stats_tags": prefix_core::protocol::stats::STATS_TAGS,
        "tokenizer_json": tokenizer_json,
        "tokenizer_config": tokenizer_config,
        "assets_port": settings.assets_port,
        "max_tokenizer_bytes": prefix_core::router_config::MAX_TOKENIZER_BYTES,
        // the chosen pod, each fallback, then one try by plain balancing
        "num_retries": MAX_FALLBACKS + 1,
    }))?;
    Ok(yaml)
}

/// Writes the EDS file of an [`Membership::EdsFile`] cluster named `pods` with these members
/// (`ip:port`): a new file renamed over the old one, which is how Envoy's watched-directory
/// source expects updates (it never reads a half-written file).
pub fn write_eds(path: &Path, members: &[String]) -> anyhow::Result<()> {
    let mut endpoints = Vec::new();
    for m in members {
        let addr: std::net::SocketAddr = m
            .parse()
            .with_context(|| format!("member '{m}' is not ip:port"))?;
        endpoints.push(json!({"endpoint": {"address": {"socket_address": {
            "address": addr.ip().to_string(), "port_value": addr.port()}}}}));
    }
    let doc = json!({"resources": [{
        "@type": "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment",
        "cluster_name": "pods",
        "endpoints": [{"lb_endpoints": endpoints}],
    }]});
    let tmp = path.with_extension("tmp");
    // JSON is YAML: Envoy reads either by the file's extension (.yaml here)
    std::fs::write(&tmp, serde_json::to_vec_pretty(&doc)?)?;
    std::fs::rename(&tmp, path)?;
    Ok(())
}

/// A Kubernetes ConfigMap named `name` holding `envoy_yaml` as its `envoy.yaml` key (what the
/// Envoy Deployment mounts at `/etc/envoy`).
pub fn configmap(name: &str, envoy_yaml: &str) -> anyhow::Result<String> {
    crate::kubernetes::configmap(
        name,
        None,
        &[],
        "envoy.yaml",
        envoy_yaml,
        "envoy/envoy.yaml.j2 by render-envoy-config",
    )
}
