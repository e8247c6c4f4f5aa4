//! Renders the Envoy configuration (the template `config-tool/envoy.yaml.j2`, built into the
//! binary, rendered with minijinja) for a given set of pods and ports.

use anyhow::Context;
use prefix_core::plugin_config::PluginConfig;
use prefix_core::policy::MAX_FALLBACKS;
use prefix_core::protocol::defaults;
use prefix_core::router_config::{DEFAULT_POLL_INTERVAL_MS, DEFAULT_TABLE_CAPACITY};
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
    /// to fetch at start: required with the filter, which carries no vocabulary.
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
    /// LoRA adapters the pods serve on top of `model_name`.
    pub adapters: Vec<String>,
    /// Other names the pods serve the model under (plugin `aliases`).
    pub aliases: Vec<String>,
    /// More models on the same listener, each with its own pods (cluster `pods_<n>`, n from
    /// 1), tokenizer and block size ([`ExtraModel`]).
    pub more_models: Vec<ExtraModel>,
    pub max_body_bytes: usize,
    pub debug_headers: bool,
    pub table_capacity: u64,
    /// `prefix`, `round_robin`, `random` or `least_loaded`.
    pub policy: String,
    pub poll_interval_ms: u64,
    /// Extra plugin-config fields merged in as-is (e.g. `weights`).
    pub extra: serde_json::Map<String, serde_json::Value>,
    /// How often Envoy merges its workers' stats (`stats_flush_interval`, e.g. `1s`); Envoy's
    /// own default (5 s) when `None`. Histograms show in the admin only once flushed, so the
    /// benchmark shortens it to read a short run's.
    pub stats_flush_interval: Option<String>,
    /// Limits and timeouts of the inference listener ([`Limits`]).
    pub limits: Limits,
    /// An environment variable of Envoy's holding the pods' API key: the filter's polls
    /// carry `Authorization: Bearer <it>` (plugin `pod_credentials`).
    pub pod_api_key_env: Option<String>,
    /// Environment variables Envoy is started with (tests: the pods' API key).
    pub env: Vec<(String, String)>,
    /// TLS (or mTLS) to the pods, for requests and the filter's polls alike.
    pub pod_tls: Option<PodTls>,
    /// Paths routed to the pods besides the built-in ones ([`api_paths`]), each with the
    /// body kind the filter reads it as (`completions`, `chat`, `responses`, `messages`,
    /// `balanced`; none: passed to the pods unread); everything else is 404 at Envoy.
    pub extra_api_paths: Vec<(String, Option<String>)>,
}

/// TLS to the pods: the CA their certificates are checked against, the name they must carry
/// (sent as SNI and matched against their certificate's DNS names), and a client certificate
/// for pods (or their mesh sidecars) that require mutual TLS. Files where Envoy runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodTls {
    pub ca: PathBuf,
    pub sni: Option<String>,
    /// Client certificate chain and its private key.
    pub cert: Option<(PathBuf, PathBuf)>,
}

/// How the gateway protects itself: connection and heap limits (Envoy's overload manager)
/// and timeouts, each an Envoy duration (`300s`; `0s`: none).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    /// The whole answer, streamed ones included (`0s`: none, so a long generation streams
    /// for as long as its tokens keep coming).
    pub route_timeout: String,
    /// An answer (or request) that sends nothing for this long is ended: a stalled pod, or
    /// a non-streamed answer that takes longer.
    pub stream_idle_timeout: String,
    /// The whole request (headers and body) must arrive within this.
    pub request_timeout: String,
    /// Downstream connections open at once; more are refused.
    pub max_connections: u64,
    /// Envoy's heap: at 90 % it returns memory, at 95 % it stops accepting requests.
    pub max_heap_bytes: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            route_timeout: "0s".into(),
            stream_idle_timeout: "300s".into(),
            request_timeout: "60s".into(),
            max_connections: 10_000,
            max_heap_bytes: 2 << 30,
        }
    }
}

/// The inference paths routed to the pods: the prefix endpoints (completions, chat,
/// Responses, Anthropic-style messages), the model list, and the balanced ones (embeddings,
/// pooling, scoring).
pub fn api_paths() -> Vec<&'static str> {
    use prefix_core::request::{Endpoint, BALANCED_PATHS};
    Endpoint::ALL
        .iter()
        .map(|e| e.path())
        .chain(["/v1/models"])
        .chain(BALANCED_PATHS)
        .collect()
}

/// Envoy's answer to any other path (the pods' metrics, events and tokenize endpoints
/// included): an OpenAI-style error.
const NOT_FOUND_BODY: &str = r#"{"error":{"message":"not found: only the inference API is served here","type":"invalid_request_error","param":null,"code":"not_found"}}"#;

/// Every path routed to the pods, the built-in ones first (each an exact match: Envoy
/// matches paths without their query string).
fn all_api_paths(extra: &[(String, Option<String>)]) -> Vec<String> {
    api_paths()
        .into_iter()
        .map(str::to_owned)
        .chain(extra.iter().map(|(p, _)| p.clone()))
        .collect()
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
            adapters: Vec::new(),
            aliases: Vec::new(),
            more_models: Vec::new(),
            max_body_bytes: defaults::MAX_BODY_BYTES,
            debug_headers: true,
            table_capacity: DEFAULT_TABLE_CAPACITY,
            policy: "prefix".into(),
            poll_interval_ms: DEFAULT_POLL_INTERVAL_MS,
            extra: serde_json::Map::new(),
            stats_flush_interval: None,
            limits: Limits::default(),
            extra_api_paths: Vec::new(),
            pod_api_key_env: None,
            env: Vec::new(),
            pod_tls: None,
        }
    }

    /// The files Envoy serves from `tokenizer_dir`: `tokenizer.json` and, when there is one,
    /// `tokenizer_config.json` (both assumed in a directory that exists only where Envoy
    /// runs). An error when a local directory has no `tokenizer.json`.
    pub fn tokenizer_files(&self) -> anyhow::Result<Option<(PathBuf, Option<PathBuf>)>> {
        tokenizer_files(self.tokenizer_dir.as_deref(), self.tokenizer_dir_remote)
    }

    /// The pool of the first model (cluster `pods`), then one per [`ExtraModel`].
    fn pools(&self) -> anyhow::Result<Vec<Pool>> {
        let mut pools = vec![Pool {
            cluster: "pods".into(),
            model_name: self.model_name.clone(),
            pods: self.pods.clone(),
            members: self.members.clone().unwrap_or_else(|| self.pods.clone()),
            block_size: self.block_size,
            adapters: self.adapters.clone(),
            aliases: self.aliases.clone(),
            tokenizer: self.tokenizer_files()?,
            template: template_file(self.tokenizer_dir.as_deref(), self.tokenizer_dir_remote),
            tokenizer_prefix: String::new(),
        }];
        for (i, m) in self.more_models.iter().enumerate() {
            let n = i + 1;
            pools.push(Pool {
                cluster: format!("pods_{n}"),
                model_name: m.model_name.clone(),
                pods: m.pods.clone(),
                members: m.pods.clone(),
                block_size: m.block_size.unwrap_or(self.block_size),
                adapters: m.adapters.clone(),
                aliases: m.aliases.clone(),
                tokenizer: tokenizer_files(m.tokenizer_dir.as_deref(), self.tokenizer_dir_remote)?,
                template: template_file(m.tokenizer_dir.as_deref(), self.tokenizer_dir_remote),
                tokenizer_prefix: format!("/models/{n}"),
            });
        }
        Ok(pools)
    }

    /// The filter's plugin configuration JSON: one model's document, or with
    /// [`EnvoySettings::more_models`] a `models` list under the shared settings.
    pub fn plugin_config(&self) -> String {
        let pools = match self.pools() {
            Ok(p) => p,
            // render() reports the error; the config is not used then
            Err(_) => return String::new(),
        };
        let mut shared = json!({
            "max_body_bytes": self.max_body_bytes,
            "debug_headers": self.debug_headers,
            "table_capacity": self.table_capacity,
            "policy": self.policy,
            "poll_interval_ms": self.poll_interval_ms,
        });
        if let (Some(env), Some(obj)) = (&self.pod_api_key_env, shared.as_object_mut()) {
            obj.insert("pod_credentials".into(), json!({ "value_from_env": env }));
        }
        let read: serde_json::Map<String, serde_json::Value> = self
            .extra_api_paths
            .iter()
            .filter_map(|(p, k)| Some((p.clone(), json!(k.as_ref()?))))
            .collect();
        if let (false, Some(obj)) = (read.is_empty(), shared.as_object_mut()) {
            obj.insert("inference_paths".into(), serde_json::Value::Object(read));
        }
        let several = pools.len() > 1;
        let mut entries: Vec<serde_json::Value> =
            pools.iter().map(|p| self.model_entry(p, several)).collect();
        if let Some(obj) = shared.as_object_mut() {
            match several {
                true => {
                    obj.insert("models".into(), json!(entries));
                }
                false => {
                    if let Some(serde_json::Value::Object(e)) = entries.pop() {
                        obj.extend(e);
                    }
                }
            }
            obj.extend(self.extra.clone());
        }
        shared.to_string()
    }

    /// One model's entry: its pods (or discovery), tokenizer, block size, adapters.
    fn model_entry(&self, pool: &Pool, several: bool) -> serde_json::Value {
        let pods = match self.membership {
            Membership::Static => json!(pool.pods),
            // the filter learns them from Envoy
            Membership::Dns | Membership::EdsFile(_) => json!([]),
        };
        let mut v = json!({
            "pods": pods,
            "block_size": pool.block_size,
            "model_name": pool.model_name,
        });
        if let Some(obj) = v.as_object_mut() {
            if !pool.aliases.is_empty() {
                obj.insert("aliases".into(), json!(pool.aliases));
            }
            if !pool.adapters.is_empty() {
                obj.insert("adapters".into(), json!(pool.adapters));
            }
            if several {
                obj.insert("route_cluster".into(), json!(pool.cluster));
            }
            if let Some((_, cfg)) = &pool.tokenizer {
                let prefix = &pool.tokenizer_prefix;
                let mut source = json!({"cluster": ASSETS_CLUSTER,
                       "path": format!("{prefix}/tokenizer.json"),
                       "config_path": cfg.is_some().then(|| format!("{prefix}/tokenizer_config.json"))});
                if let (Some(_), Some(src)) = (&pool.template, source.as_object_mut()) {
                    src.insert(
                        "template_path".into(),
                        json!(format!("{prefix}/chat_template.jinja")),
                    );
                }
                obj.insert("tokenizer".into(), source);
            }
            if self.membership != Membership::Static {
                obj.insert("discovery".into(), json!({"cluster": pool.cluster}));
            }
        }
        v
    }
}

/// Another model behind the same listener: its own pods (a cluster of their own), tokenizer
/// and block size. Written on the command line as space-separated `key=value` pairs:
/// `name=Qwen2.5-0.5B-Instruct pods=10.0.0.7:8000,10.0.0.8:8000 tokenizer-dir=/models/qwen
/// block-size=16 adapters=a,b` (`name` and `pods` required).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExtraModel {
    pub model_name: String,
    /// `ip:port` (or `name:port` when the first model's pods are DNS names).
    pub pods: Vec<String>,
    pub tokenizer_dir: Option<PathBuf>,
    /// Default: the first model's.
    pub block_size: Option<u32>,
    pub adapters: Vec<String>,
    /// Other names of the model.
    pub aliases: Vec<String>,
}

impl std::str::FromStr for ExtraModel {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let mut m = ExtraModel {
            model_name: String::new(),
            pods: Vec::new(),
            tokenizer_dir: None,
            block_size: None,
            adapters: Vec::new(),
            aliases: Vec::new(),
        };
        let list = |v: &str| {
            v.split(',')
                .filter(|x| !x.is_empty())
                .map(str::to_owned)
                .collect()
        };
        for pair in s.split_whitespace() {
            let (k, v) = pair
                .split_once('=')
                .ok_or_else(|| format!("'{pair}' is not key=value"))?;
            match k {
                "name" => m.model_name = v.to_owned(),
                "pods" => m.pods = list(v),
                "tokenizer-dir" => m.tokenizer_dir = Some(PathBuf::from(v)),
                "block-size" => {
                    m.block_size = Some(
                        v.parse()
                            .map_err(|_| format!("block-size '{v}' is not a number"))?,
                    )
                }
                "adapters" => m.adapters = list(v),
                "aliases" => m.aliases = list(v),
                other => {
                    return Err(format!(
                        "unknown key '{other}' (name, pods, tokenizer-dir, block-size, adapters, aliases)"
                    ))
                }
            }
        }
        if m.model_name.is_empty() || m.pods.is_empty() {
            return Err("name=… and pods=… are required".into());
        }
        Ok(m)
    }
}

/// One model's pool as the template and the plugin configuration see it.
struct Pool {
    cluster: String,
    model_name: String,
    /// what the filter is told (plugin `pods`)
    pods: Vec<String>,
    /// the Envoy cluster's members
    members: Vec<String>,
    block_size: u32,
    adapters: Vec<String>,
    aliases: Vec<String>,
    tokenizer: Option<(PathBuf, Option<PathBuf>)>,
    /// `chat_template.jinja` beside the tokenizer, when the model keeps its template there
    template: Option<PathBuf>,
    /// where the assets listener serves its tokenizer files (`""`: at the root)
    tokenizer_prefix: String,
}

/// The tokenizer files of a model directory (see [`EnvoySettings::tokenizer_files`]).
fn tokenizer_files(
    dir: Option<&Path>,
    remote: bool,
) -> anyhow::Result<Option<(PathBuf, Option<PathBuf>)>> {
    let Some(dir) = dir else {
        return Ok(None);
    };
    if remote {
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

/// A local model directory's `chat_template.jinja`, if it has one (a directory that exists
/// only where Envoy runs is taken to keep its template in `tokenizer_config.json`).
fn template_file(dir: Option<&Path>, remote: bool) -> Option<PathBuf> {
    let file = std::path::absolute(dir?.join("chat_template.jinja")).ok()?;
    (!remote && file.is_file()).then_some(file)
}

/// The cluster (and loopback listener) through which Envoy serves the tokenizer files.
pub const ASSETS_CLUSTER: &str = "prefix_router_assets";

/// The Envoy template's name.
pub const TEMPLATE: &str = "envoy.yaml.j2";

/// The template, built in: the tool needs no checkout to run.
const TEMPLATE_SOURCE: &str = include_str!("../envoy.yaml.j2");

/// Renders the config, after validating the plugin configuration exactly as the filter will
/// (a bad value fails here, with the field named).
pub fn render(settings: &EnvoySettings) -> anyhow::Result<String> {
    settings.pools()?;
    let l = &settings.limits;
    for (field, d) in [
        ("route-timeout", &l.route_timeout),
        ("stream-idle-timeout", &l.stream_idle_timeout),
        ("request-timeout", &l.request_timeout),
    ] {
        let secs = d.strip_suffix('s').and_then(|n| n.parse::<f64>().ok());
        if !secs.is_some_and(|s| s >= 0.0) {
            anyhow::bail!(
                "--{field} '{d}' must be seconds, as Envoy writes them (e.g. 300s, 1.5s, 0s)"
            );
        }
    }
    for (p, kind) in &settings.extra_api_paths {
        if !prefix_core::request::PathKind::valid_path(p) {
            anyhow::bail!("inference path '{p}' must be a path starting with '/'");
        }
        if let Some(k) = kind {
            prefix_core::request::PathKind::try_from(k.clone())
                .map_err(|e| anyhow::anyhow!("inference path '{p}': {e}"))?;
        }
    }
    if settings.wasm.is_some() {
        // the .wasm carries no vocabulary: every model's tokenizer is served by Envoy
        for pool in settings.pools()? {
            if pool.tokenizer.is_none() {
                anyhow::bail!(
                    "model '{}' has no tokenizer directory (tokenizer-dir): the filter carries no vocabulary and fetches the model's tokenizer.json at start",
                    pool.model_name
                );
            }
        }
        PluginConfig::parse(settings.plugin_config().as_bytes())?;
    }
    render_unchecked(settings)
}

/// A pod written as `host:port` for a cluster's endpoint (a DNS name with `Membership::Dns`).
fn endpoint(pod: &str, membership: &Membership) -> anyhow::Result<serde_json::Value> {
    let (host, port) = match membership {
        Membership::Dns => {
            let (host, port) = pod
                .rsplit_once(':')
                .with_context(|| format!("pod '{pod}' is not name:port"))?;
            let port: u16 = port
                .parse()
                .with_context(|| format!("pod '{pod}': bad port"))?;
            (host.to_owned(), port)
        }
        _ => {
            let addr: std::net::SocketAddr = pod
                .parse()
                .with_context(|| format!("pod '{pod}' is not ip:port"))?;
            (addr.ip().to_string(), addr.port())
        }
    };
    Ok(json!({"host": host, "port": port}))
}

/// Renders without validating the plugin configuration: only for proving that Envoy itself
/// refuses a bad one.
pub fn render_unchecked(settings: &EnvoySettings) -> anyhow::Result<String> {
    let plugin = settings.plugin_config();
    let (membership, eds_path, eds_dir) = match &settings.membership {
        Membership::Static => ("static", None, None),
        Membership::Dns => ("dns", None, None),
        Membership::EdsFile(p) => (
            "eds",
            Some(p.display().to_string()),
            p.parent().map(|d| d.display().to_string()),
        ),
    };
    let pools = settings.pools()?;
    if pools.len() > 1 && membership == "eds" {
        anyhow::bail!(
            "several models take their pods from fixed lists or DNS names, not an EDS file"
        );
    }
    let mut pool_values = Vec::new();
    for p in &pools {
        let members = p
            .members
            .iter()
            .map(|m| endpoint(m, &settings.membership))
            .collect::<anyhow::Result<Vec<_>>>()?;
        let path = |f: &PathBuf| f.display().to_string();
        pool_values.push(json!({
            "cluster": p.cluster,
            "members": members,
            "tokenizer_prefix": p.tokenizer_prefix,
            "tokenizer_json": p.tokenizer.as_ref().map(|(j, _)| path(j)),
            "tokenizer_config": p.tokenizer.as_ref().and_then(|(_, c)| c.as_ref().map(path)),
            "chat_template": p.template.as_ref().map(path),
        }));
    }
    let mut env = minijinja::Environment::new();
    env.set_undefined_behavior(minijinja::UndefinedBehavior::Strict);
    env.add_template(TEMPLATE, TEMPLATE_SOURCE)?;
    let yaml = env.get_template(TEMPLATE)?.render(json!({
        "admin_port": settings.admin_port,
        "stats_flush_interval": settings.stats_flush_interval,
        "route_timeout": settings.limits.route_timeout,
        "stream_idle_timeout": settings.limits.stream_idle_timeout,
        "request_timeout": settings.limits.request_timeout,
        "max_connections": settings.limits.max_connections,
        "max_heap_bytes": settings.limits.max_heap_bytes,
        "api_paths": all_api_paths(&settings.extra_api_paths),
        "not_found_body": NOT_FOUND_BODY,
        "pod_tls": settings.pod_tls.as_ref().map(|t| json!({
            "ca": t.ca.display().to_string(),
            "sni": t.sni,
            "cert": t.cert.as_ref().map(|(c, _)| c.display().to_string()),
            "key": t.cert.as_ref().map(|(_, k)| k.display().to_string()),
        })),
        "pod_credentials_env": settings.pod_api_key_env.as_ref().filter(|_| settings.wasm.is_some()),
        "listen_port": settings.listen_port,
        "listen_address": settings.listen_address,
        "stats_port": settings.stats_port,
        "buffer_limit": settings.max_body_bytes + 64 * 1024,
        "plugin_config": plugin,
        "wasm_path": settings.wasm.as_ref().map(|p| p.display().to_string()),
        "pools": pool_values,
        "several": pools.len() > 1,
        "route_cluster_header": prefix_core::protocol::headers::ROUTE_CLUSTER,
        "membership": membership,
        "discovery": settings.wasm.is_some() && settings.membership != Membership::Static,
        "eds_path": eds_path,
        "eds_dir": eds_dir,
        "dns_refresh": settings.dns_refresh,
        "stats_tags": prefix_core::protocol::stats::STATS_TAGS,
        "assets": pools.iter().any(|p| p.tokenizer.is_some()),
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
    crate::configmap::configmap(
        name,
        None,
        &[],
        "envoy.yaml",
        envoy_yaml,
        "prefix-router's Envoy template by render-envoy-config",
    )
}

/// Whether every pod is written as `ip:port` (a fixed list) rather than `name:port`.
pub fn all_addresses(pods: &[String]) -> bool {
    pods.iter()
        .all(|p| p.parse::<std::net::SocketAddr>().is_ok())
}
