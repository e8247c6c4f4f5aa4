//! The gateway described in one YAML file (`render-envoy-config --config gateway.yaml`): the
//! listener, each pool (model, pods, tokenizer, block size, adapters, names), the policy and
//! its weights, liveness, events, timeouts, TLS and credentials. Read once into typed
//! settings; an unknown or mistyped field is an error naming its path (`pools[1].block_size`),
//! and the filter's own settings (`weights`, `down_after_failures`, …) are then validated
//! exactly as the filter will, by the same names.
//!
//! ```yaml
//! listen: { address: 0.0.0.0, port: 10000, stats_port: 9902 }
//! pools:
//!   - model: Qwen2.5-0.5B-Instruct
//!     pods: [vllm-0.vllm:8000, vllm-1.vllm:8000]
//!     tokenizer_dir: /models/qwen
//!     block_size: 16
//! weights: { prefix: 8, inflight: 1 }
//! limits: { route_timeout: 600s }
//! pod_tls: { ca: /etc/tls/ca.pem, sni: vllm.internal }
//! ```

use crate::envoy::{EnvoySettings, ExtraModel, Limits, Membership, PodTls};
use prefix_core::protocol::defaults;
use serde::Deserialize;
use serde_json::{Map, Value};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GatewayFile {
    #[serde(default)]
    listen: Listen,
    /// The filter's .wasm (else `--wasm`, else the install location).
    wasm: Option<PathBuf>,
    /// Render Envoy without the filter (plain round robin).
    #[serde(default)]
    no_filter: bool,
    /// At least one; requests naming no model go to the first.
    pools: Vec<PoolFile>,
    /// Take the first pool's members from this EDS file instead of `pods`.
    eds_file: Option<PathBuf>,
    #[serde(default = "default_dns_refresh")]
    dns_refresh: String,
    /// `reject` or a pool's model: what requests naming another model get.
    unknown_model: Option<String>,
    #[serde(default = "default_policy")]
    policy: String,
    /// The prefix policy's weights (`prefix`, `inflight`, …), as the filter names them.
    weights: Option<Value>,
    poll_interval_ms: Option<u64>,
    down_after_failures: Option<u64>,
    max_body_bytes: Option<usize>,
    max_prompt_tokens: Option<u64>,
    table_capacity: Option<u64>,
    #[serde(default)]
    debug_headers: bool,
    /// Where each pod's cache events are served (a `kv-events` sidecar).
    events: Option<Events>,
    #[serde(default)]
    limits: LimitsFile,
    pod_tls: Option<TlsFile>,
    pod_api_key_env: Option<String>,
    /// More paths to route to the pods: `{"/v1/generate": "completions"}`, or `null` for
    /// a path passed on unread.
    #[serde(default)]
    inference_paths: BTreeMap<String, Option<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Listen {
    #[serde(default = "default_address")]
    address: std::net::IpAddr,
    #[serde(default = "default_port")]
    port: u16,
    stats_port: Option<u16>,
    #[serde(default = "default_admin_port")]
    admin_port: u16,
    #[serde(default = "default_assets_port")]
    assets_port: u16,
}

impl Default for Listen {
    fn default() -> Self {
        Listen {
            address: default_address(),
            port: default_port(),
            stats_port: None,
            admin_port: default_admin_port(),
            assets_port: default_assets_port(),
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PoolFile {
    model: String,
    /// `ip:port` (a fixed list) or `name:port` (resolved by Envoy).
    #[serde(default)]
    pods: Vec<String>,
    tokenizer_dir: Option<PathBuf>,
    /// The directory exists only where Envoy runs (a pod's volume): not checked here.
    #[serde(default)]
    tokenizer_dir_in_envoy: bool,
    block_size: Option<u32>,
    #[serde(default)]
    adapters: Vec<String>,
    #[serde(default)]
    aliases: Vec<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Events {
    port: Option<u16>,
    #[serde(default)]
    addresses: BTreeMap<String, String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct LimitsFile {
    route_timeout: Option<String>,
    stream_idle_timeout: Option<String>,
    request_timeout: Option<String>,
    max_connections: Option<u64>,
    max_heap_bytes: Option<u64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TlsFile {
    ca: PathBuf,
    sni: Option<String>,
    cert: Option<PathBuf>,
    key: Option<PathBuf>,
}

fn default_address() -> std::net::IpAddr {
    std::net::IpAddr::from([127, 0, 0, 1])
}
fn default_port() -> u16 {
    10000
}
fn default_admin_port() -> u16 {
    9901
}
fn default_assets_port() -> u16 {
    9903
}
fn default_dns_refresh() -> String {
    "5s".into()
}
fn default_policy() -> String {
    "prefix".into()
}

/// A field's problem, named by its path in the file.
fn field_error(path: &str, reason: impl std::fmt::Display) -> anyhow::Error {
    anyhow::anyhow!("field '{path}': {reason}")
}

impl GatewayFile {
    /// Reads and checks the file's shape (every field typed, none unknown).
    pub fn read(path: &Path) -> anyhow::Result<GatewayFile> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| anyhow::anyhow!("reading {}: {e}", path.display()))?;
        Self::parse(&text).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))
    }

    pub fn parse(text: &str) -> anyhow::Result<GatewayFile> {
        let de = serde_norway::Deserializer::from_str(text);
        let f: GatewayFile = serde_path_to_error::deserialize(de).map_err(|e| {
            let path = e.path().to_string();
            field_error(&path, e.into_inner())
        })?;
        if f.pools.is_empty() {
            return Err(field_error("pools", "at least one pool is required"));
        }
        for (i, p) in f.pools.iter().enumerate() {
            if p.pods.is_empty() && !(i == 0 && f.eds_file.is_some()) {
                return Err(field_error(&format!("pools[{i}].pods"), "at least one pod"));
            }
        }
        if f.pod_tls
            .as_ref()
            .is_some_and(|t| t.cert.is_some() != t.key.is_some())
        {
            return Err(field_error("pod_tls", "`cert` and `key` go together"));
        }
        Ok(f)
    }

    /// The .wasm the file names.
    pub fn wasm(&self) -> Option<PathBuf> {
        self.wasm.clone()
    }

    /// Envoy without the filter (plain round robin).
    pub fn no_filter(&self) -> bool {
        self.no_filter
    }

    /// The settings to render, with `wasm` the filter to load (`None`: Envoy without it).
    pub fn settings(self, wasm: Option<PathBuf>) -> anyhow::Result<EnvoySettings> {
        let mut pools = self.pools.into_iter();
        let first = pools
            .next()
            .ok_or_else(|| field_error("pools", "at least one pool is required"))?;
        let membership = match (&self.eds_file, crate::envoy::all_addresses(&first.pods)) {
            (Some(path), _) => Membership::EdsFile(std::path::absolute(path)?),
            (None, true) => Membership::Static,
            (None, false) => Membership::Dns,
        };
        let mut s = EnvoySettings::new(self.listen.port, self.listen.admin_port, first.pods, wasm);
        s.membership = membership;
        s.dns_refresh = self.dns_refresh;
        s.listen_address = self.listen.address.to_string();
        s.stats_port = self.listen.stats_port;
        s.assets_port = self.listen.assets_port;
        s.model_name = first.model;
        s.block_size = first.block_size.unwrap_or(defaults::BLOCK_SIZE);
        s.tokenizer_dir = match first.tokenizer_dir {
            Some(d) => Some(d),
            None => crate::install::tokenizer_dir_for(
                s.wasm.is_some(),
                &s.model_name,
                "pools[0].tokenizer_dir",
            )?,
        };
        s.tokenizer_dir_remote = first.tokenizer_dir_in_envoy;
        s.adapters = first.adapters;
        s.aliases = first.aliases;
        s.more_models = pools
            .map(|p| ExtraModel {
                model_name: p.model,
                pods: p.pods,
                tokenizer_dir: p.tokenizer_dir,
                block_size: p.block_size,
                adapters: p.adapters,
                aliases: p.aliases,
            })
            .collect();
        s.policy = self.policy;
        s.debug_headers = self.debug_headers;
        if let Some(n) = self.max_body_bytes {
            s.max_body_bytes = n;
        }
        if let Some(n) = self.table_capacity {
            s.table_capacity = n;
        }
        if let Some(n) = self.poll_interval_ms {
            s.poll_interval_ms = n;
        }
        let mut extra = Map::new();
        let mut put = |k: &str, v: Option<Value>| {
            if let Some(v) = v {
                extra.insert(k.into(), v);
            }
        };
        put("unknown_model", self.unknown_model.map(Value::from));
        put("weights", self.weights);
        put(
            "down_after_failures",
            self.down_after_failures.map(Value::from),
        );
        put("max_prompt_tokens", self.max_prompt_tokens.map(Value::from));
        put(
            "events",
            self.events
                .map(|e| serde_json::json!({"port": e.port, "addresses": e.addresses})),
        );
        s.extra = extra;
        let d = Limits::default();
        let l = self.limits;
        s.limits = Limits {
            route_timeout: l.route_timeout.unwrap_or(d.route_timeout),
            stream_idle_timeout: l.stream_idle_timeout.unwrap_or(d.stream_idle_timeout),
            request_timeout: l.request_timeout.unwrap_or(d.request_timeout),
            max_connections: l.max_connections.unwrap_or(d.max_connections),
            max_heap_bytes: l.max_heap_bytes.unwrap_or(d.max_heap_bytes),
        };
        s.pod_tls = self.pod_tls.map(|t| PodTls {
            ca: t.ca,
            sni: t.sni,
            cert: t.cert.zip(t.key),
        });
        s.pod_api_key_env = self.pod_api_key_env;
        s.extra_api_paths = self.inference_paths.into_iter().collect();
        Ok(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mistakes_are_named_by_their_path() {
        for (yaml, named) in [
            ("pools: []", "pools"),
            (
                "pools: [{model: m, pods: [1.2.3.4:5], block_sise: 16}]",
                "pools[0].block_sise",
            ),
            (
                "pools: [{model: m, pods: [1.2.3.4:5], block_size: many}]",
                "pools[0].block_size",
            ),
            ("pools: [{model: m}]", "pools[0].pods"),
            (
                "pools: [{model: m, pods: [1.2.3.4:5]}]\nlisten: {port: 99999}",
                "listen.port",
            ),
            (
                "pools: [{model: m, pods: [1.2.3.4:5]}]\npod_tls: {ca: c, cert: x}",
                "pod_tls",
            ),
            (
                "pools: [{model: m, pods: [1.2.3.4:5]}]\nlimits: {route_timeout: 5s, retries: 3}",
                "limits.retries",
            ),
        ] {
            let e = GatewayFile::parse(yaml).unwrap_err().to_string();
            assert!(e.starts_with(&format!("field '{named}'")), "{yaml}: {e}");
        }
    }

    #[test]
    fn a_file_becomes_the_settings_the_flags_would_make() {
        let f = GatewayFile::parse(
            "pools:\n  - {model: a, pods: [10.0.0.1:8000], block_size: 16, adapters: [sql], tokenizer_dir: /m/a, tokenizer_dir_in_envoy: true}\n  - {model: b, pods: [10.0.0.2:8000], tokenizer_dir: /m/b}\n\
             weights: {prefix: 4}\ndown_after_failures: 3\nlimits: {route_timeout: 600s}\n\
             inference_paths: {/v1/generate: completions, /v1/audio: null}\nunknown_model: b\n",
        )
        .unwrap();
        let s = f.settings(Some(PathBuf::from("/f.wasm"))).unwrap();
        assert_eq!((s.model_name.as_str(), s.block_size), ("a", 16));
        assert_eq!(s.membership, Membership::Static);
        assert_eq!(s.more_models[0].model_name, "b");
        assert_eq!(s.limits.route_timeout, "600s");
        let plugin: Value = serde_json::from_str(&s.plugin_config()).unwrap();
        assert_eq!(plugin["weights"]["prefix"], 4);
        assert_eq!(plugin["down_after_failures"], 3);
        assert_eq!(plugin["unknown_model"], "b");
        assert_eq!(plugin["inference_paths"]["/v1/generate"], "completions");
        assert_eq!(plugin["models"][0]["adapters"][0], "sql");
        assert_eq!(
            plugin["models"][1]["tokenizer"]["path"],
            "/models/1/tokenizer.json"
        );
    }

    /// The .wasm carries no vocabulary: a model other than the default one needs its
    /// directory, named by its field; without the filter none is needed.
    #[test]
    fn a_model_without_a_tokenizer_directory_is_refused() {
        let yaml = "pools: [{model: m, pods: [10.0.0.1:8000]}]";
        let e = GatewayFile::parse(yaml)
            .unwrap()
            .settings(Some(PathBuf::from("/f.wasm")))
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("pools[0].tokenizer_dir is required"), "{e}");
        assert!(GatewayFile::parse(yaml).unwrap().settings(None).is_ok());
        let two = "pools: [{model: m, pods: [10.0.0.1:8000], tokenizer_dir: /m, tokenizer_dir_in_envoy: true}, {model: n, pods: [10.0.0.2:8000]}]";
        let s = GatewayFile::parse(two)
            .unwrap()
            .settings(Some(PathBuf::from("/f.wasm")))
            .unwrap();
        let e = crate::envoy::render(&s).unwrap_err().to_string();
        assert!(e.contains("model 'n' has no tokenizer directory"), "{e}");
    }
}
