//! The routing filter's plugin configuration: parsed and validated once into typed settings;
//! a bad value is reported by its path (`pods[2]`, `weights.prefix`).

use crate::block::BlockSize;
use crate::membership::MAX_MEMBERS;
use crate::pod_costs::CostPrior;
use crate::policy::{Policy, Weights};
use crate::protocol::defaults;
use serde::Deserialize;
use std::fmt;
use std::net::SocketAddr;

/// A pod's address as configured: a valid `ip:port`, kept in its configured spelling (that
/// spelling is what Envoy matches the destination header against, and what table entries
/// name across Envoys).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Deserialize)]
#[serde(try_from = "String")]
pub struct PodAddr(String);

impl PodAddr {
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl TryFrom<String> for PodAddr {
    type Error = String;
    fn try_from(s: String) -> Result<Self, String> {
        match s.parse::<SocketAddr>() {
            Ok(_) => Ok(PodAddr(s)),
            Err(_) => Err(format!("'{s}' is not an ip:port address")),
        }
    }
}

impl fmt::Display for PodAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl AsRef<str> for PodAddr {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

/// Plugin configuration (JSON in the Envoy wasm filter's `configuration`), validated.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RouterConfig {
    /// Model-server pods as `ip:port` (1–1024). With `discovery`, only the members until
    /// Envoy's first answer (may be empty).
    #[serde(default)]
    pub pods: Vec<PodAddr>,
    /// Follow the members of an Envoy cluster (STATIC, STRICT_DNS, EDS) instead of `pods`.
    #[serde(default)]
    pub discovery: Option<Discovery>,
    /// Where the model's tokenizer (and chat template) comes from at run time: the filter
    /// carries none, so without it requests are balanced by load (and an error is logged).
    #[serde(default)]
    pub tokenizer: Option<TokenizerSource>,
    /// Prefix-cache block size in tokens; must equal the servers' `--block-size`.
    #[serde(default)]
    pub block_size: BlockSize,
    /// Served model name; seeds the block hashes exactly as the servers do.
    #[serde(default = "default_model_name")]
    pub model_name: String,
    /// LoRA adapter names the pods serve on top of `model_name`: routed in the same pool,
    /// their blocks keyed apart (different adapters never share a cached prefix).
    #[serde(default)]
    pub adapters: Vec<String>,
    /// Other names the pods serve the model under (vLLM's several `--served-model-name`s;
    /// `model_name` is the first, the one that seeds the hashes): requests naming one are
    /// routed as the model's own, sharing its blocks.
    #[serde(default)]
    pub aliases: Vec<String>,
    /// Largest request body the filter buffers; larger bodies get 413.
    #[serde(default = "default_max_body_bytes")]
    pub max_body_bytes: usize,
    /// Most prompt tokens the router reads: set it to the pods' context length
    /// (`--max-model-len`). Reading stops at a cut before `8 ×` this many bytes
    /// ([`RouterConfig::read_limit_bytes`]), so no prompt costs the gateway more, and the
    /// decision rests on the blocks before it (`x-prefix-router-prompt-read` says so).
    #[serde(default = "default_max_prompt_tokens")]
    pub max_prompt_tokens: usize,
    /// Add `x-prefix-router-*` response headers (pod, reason, matched blocks).
    #[serde(default)]
    pub debug_headers: bool,
    /// Credentials the filter's own calls to the pods carry (pods that require an API key,
    /// such as vLLM's `--api-key`, answer its polls 401 without them).
    #[serde(default)]
    pub pod_credentials: Option<PodCredentials>,
    /// Where each pod's cache events are served when the pod does not serve them itself:
    /// vLLM and SGLang publish theirs over ZMQ, and the `kv-events` sidecar beside each pod
    /// serves them as this project's page. Without it, pods are asked themselves.
    #[serde(default)]
    pub events: Option<EventsSource>,
    /// TESTS ONLY: a request carrying this header ends the filter's VM (a wasm trap), so a
    /// test can prove that Envoy brings the filter back (`FAIL_RELOAD`). Never set it where
    /// clients can reach the listener: any of them could then crash the filter.
    #[serde(default)]
    pub test_only_crash_header: Option<String>,
    /// Entries in the ownership table (four per shared-data key; memory stays bounded).
    #[serde(default = "default_table_capacity")]
    pub table_capacity: u64,
    /// `prefix` (default), `round_robin`, `random` or `least_loaded`.
    #[serde(default)]
    pub policy: Policy,
    /// Weights of the prefix policy.
    #[serde(default)]
    pub weights: Weights,
    /// What a pod is assumed to cost until it reports its own counters (weighs a spill, and
    /// when a routed prompt's blocks count as the pod's).
    #[serde(default)]
    pub cost: CostPrior,
    /// How often pods are polled for health, load and cache events (0 disables polling).
    #[serde(default = "default_poll_interval_ms")]
    pub poll_interval_ms: u64,
    /// Consecutive failed polls after which a pod is marked down.
    #[serde(default = "default_down_after_failures")]
    pub down_after_failures: u32,
    /// Envoy cluster the poller calls pods through: an ORIGINAL_DST cluster on the destination
    /// header, so a poll reaches exactly the pod it names (never the request cluster, whose
    /// balancer may pick another pod).
    #[serde(default = "default_cluster")]
    pub cluster: String,
    /// The Envoy cluster that holds this model's pods and that its requests are routed to.
    /// With several models (`models`), the filter names it in `x-prefix-router-cluster` and
    /// the listener's routes match on that header, one route per cluster.
    #[serde(default = "default_pods_cluster")]
    pub route_cluster: String,
    /// More inference paths than the built-in ones, each with its body kind
    /// (`completions`, `chat`, `responses`, `messages`, or `balanced`: only its model read).
    #[serde(default)]
    pub inference_paths: std::collections::BTreeMap<String, crate::request::PathKind>,
}

/// Where a pod's cache-events page is: its `kv-events` sidecar.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EventsSource {
    /// The sidecar's port on each pod's own host (Kubernetes: a container of the pod).
    #[serde(default)]
    pub port: Option<u16>,
    /// Page addresses by pod address, for sidecars that are not on their pod's address
    /// (tests and demos run several pods on one host); before `port`.
    #[serde(default)]
    pub addresses: std::collections::BTreeMap<String, PodAddr>,
}

/// A header for the filter's own calls to pods, its value read from an environment variable
/// of Envoy's (a Kubernetes Secret's, typically) when the filter starts: never written in
/// the configuration, never logged. Envoy passes the variable to the filter only when its
/// `vm_config.environment_variables.host_env_keys` lists it (`render-envoy-config
/// --pod-api-key-env` writes both). Clients' own `Authorization` headers go to the pods
/// untouched.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PodCredentials {
    /// The environment variable holding the value.
    pub value_from_env: String,
    /// The header (`authorization`).
    #[serde(default = "default_credentials_header")]
    pub header: String,
    /// Written before the value (`Bearer `, as vLLM's `--api-key` expects).
    #[serde(default = "default_credentials_prefix")]
    pub prefix: String,
}

fn default_credentials_header() -> String {
    "authorization".to_owned()
}
fn default_credentials_prefix() -> String {
    "Bearer ".to_owned()
}

/// Where the pods come from when they are not a fixed list: the members of an Envoy cluster,
/// read from Envoy's own admin (`prefix_core::protocol::envoy_clusters`) on every poll.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Discovery {
    /// The cluster whose members are the pods: the one requests are routed to.
    #[serde(default = "default_pods_cluster")]
    pub cluster: String,
    /// A cluster that reaches Envoy's admin interface (`127.0.0.1:<admin port>`).
    #[serde(default = "default_admin_cluster")]
    pub admin_cluster: String,
}

/// The tokenizer fetched over HTTP through an Envoy cluster when the filter starts (each worker
/// VM fetches its own copy; until it has one, requests are balanced by load). The cluster can
/// be Envoy itself serving local files (what `render-envoy-config --tokenizer-dir` writes), a
/// model registry, or any HTTP server holding a Hugging Face model directory.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenizerSource {
    /// The Envoy cluster to fetch from.
    pub cluster: String,
    /// Path of `tokenizer.json`.
    #[serde(default = "default_tokenizer_path")]
    pub path: String,
    /// Path of `tokenizer_config.json` (the chat template, BOS/EOS tokens); `null` for none.
    #[serde(default = "default_tokenizer_config_path")]
    pub config_path: Option<String>,
    /// Path of `chat_template.jinja`, for models that keep their chat template in a file of
    /// its own (it wins over `tokenizer_config.json`'s); none by default.
    #[serde(default)]
    pub template_path: Option<String>,
    /// `:authority` of the requests (the cluster's virtual host).
    #[serde(default = "default_tokenizer_authority")]
    pub authority: String,
    /// Timeout of each fetch; a failed fetch is retried with a growing delay (up to 30 s).
    #[serde(default = "default_tokenizer_timeout_ms")]
    pub timeout_ms: u64,
}

/// Most LoRA adapter names one filter serves.
pub const MAX_ADAPTERS: usize = 256;

/// Largest tokenizer file the filter accepts (the biggest Hugging Face `tokenizer.json`s are
/// tens of MB).
pub const MAX_TOKENIZER_BYTES: usize = 64 * 1024 * 1024;

fn default_tokenizer_path() -> String {
    "/tokenizer.json".to_owned()
}
fn default_tokenizer_config_path() -> Option<String> {
    Some("/tokenizer_config.json".to_owned())
}
fn default_tokenizer_authority() -> String {
    "prefix-router-assets".to_owned()
}
fn default_tokenizer_timeout_ms() -> u64 {
    10_000
}

fn default_pods_cluster() -> String {
    "pods".to_owned()
}
fn default_admin_cluster() -> String {
    "envoy_admin".to_owned()
}

/// Default of `poll_interval_ms`. The table learns evictions from the events a poll brings,
/// so until then a pod is taken to hold what it no longer does: on long prefixes with caches
/// that hold about one context each, 100 ms instead of 500 gave +18 % req/s and +0.09 hit
/// rate (`docs/benchmarks.md`, "Fresher events"). A poll is one small GET per pod (the
/// Gateway API Inference Extension scrapes its pods' metrics every 50 ms).
pub const DEFAULT_POLL_INTERVAL_MS: u64 = 100;
/// Default of `table_capacity`.
pub const DEFAULT_TABLE_CAPACITY: u64 = 65_536;

fn default_poll_interval_ms() -> u64 {
    DEFAULT_POLL_INTERVAL_MS
}
fn default_down_after_failures() -> u32 {
    2
}
fn default_cluster() -> String {
    "pod_polls".to_owned()
}
fn default_model_name() -> String {
    defaults::MODEL_NAME.to_owned()
}
fn default_max_body_bytes() -> usize {
    defaults::MAX_BODY_BYTES
}
fn default_max_prompt_tokens() -> usize {
    defaults::MAX_PROMPT_TOKENS
}
fn default_table_capacity() -> u64 {
    DEFAULT_TABLE_CAPACITY
}

/// A configuration that cannot work.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("invalid prefix-router configuration: field '{field}': {reason}")]
pub struct ConfigError {
    /// Path of the bad value (`pods[1]`, `weights.prefix`), or `.` for the document.
    pub field: String,
    pub reason: String,
}

pub(crate) fn err(field: &str, reason: impl Into<String>) -> ConfigError {
    ConfigError {
        field: field.to_owned(),
        reason: reason.into(),
    }
}

impl RouterConfig {
    /// Bytes of prompt text the router reads at most (`max_prompt_tokens` ×
    /// [`defaults::READ_BYTES_PER_TOKEN`]).
    pub fn read_limit_bytes(&self) -> usize {
        self.max_prompt_tokens
            .saturating_mul(defaults::READ_BYTES_PER_TOKEN)
    }

    /// Full blocks of `max_prompt_tokens`: the deepest the router looks.
    pub fn max_prompt_blocks(&self) -> usize {
        (self.max_prompt_tokens / self.block_size.get() as usize).max(1)
    }

    /// Where the pod at `pod` serves its cache events: its sidecar (`events`), or itself.
    pub fn events_addr<'a>(&'a self, pod: &'a str) -> std::borrow::Cow<'a, str> {
        let Some(e) = &self.events else {
            return pod.into();
        };
        if let Some(a) = e.addresses.get(pod) {
            return a.as_str().into();
        }
        match (e.port, pod.parse::<SocketAddr>()) {
            (Some(port), Ok(mut addr)) => {
                addr.set_port(port);
                addr.to_string().into()
            }
            _ => pod.into(),
        }
    }

    /// Parses and validates the plugin configuration bytes.
    pub fn parse(bytes: &[u8]) -> Result<Self, ConfigError> {
        let de = &mut serde_json::Deserializer::from_slice(bytes);
        let c: RouterConfig = serde_path_to_error::deserialize(de).map_err(|e| ConfigError {
            field: e.path().to_string(),
            reason: e.into_inner().to_string(),
        })?;
        c.validate()?;
        Ok(c)
    }

    /// The checks serde's types cannot express.
    fn validate(&self) -> Result<(), ConfigError> {
        if self.pods.is_empty() && self.discovery.is_none() {
            return Err(err(
                "pods",
                "at least one pod (ip:port) is required (or `discovery`)",
            ));
        }
        if let Some(p) = self
            .inference_paths
            .keys()
            .find(|p| !crate::request::PathKind::valid_path(p))
        {
            return Err(err(
                "inference_paths",
                format!("'{p}' must be a path starting with '/' (no query)"),
            ));
        }
        if self.pods.len() > MAX_MEMBERS {
            return Err(err("pods", format!("at most {MAX_MEMBERS} pods")));
        }
        if let Some(d) = &self.discovery {
            if d.cluster.is_empty() {
                return Err(err("discovery.cluster", "must not be empty"));
            }
            if d.admin_cluster.is_empty() {
                return Err(err("discovery.admin_cluster", "must not be empty"));
            }
            if self.poll_interval_ms == 0 {
                return Err(err(
                    "discovery",
                    "members are read on every poll: poll_interval_ms must not be 0",
                ));
            }
        }
        if let Some(t) = &self.tokenizer {
            if t.cluster.is_empty() {
                return Err(err("tokenizer.cluster", "must not be empty"));
            }
            for (field, path) in [
                ("tokenizer.path", Some(&t.path)),
                ("tokenizer.config_path", t.config_path.as_ref()),
                ("tokenizer.template_path", t.template_path.as_ref()),
            ] {
                if path.is_some_and(|p| !p.starts_with('/')) {
                    return Err(err(field, "must be an absolute path (/…)"));
                }
            }
            if !(100..=600_000).contains(&t.timeout_ms) {
                return Err(err(
                    "tokenizer.timeout_ms",
                    "must be between 100 and 600000",
                ));
            }
        }
        if self.block_size.get() > 65_536 {
            return Err(err("block_size", "must be between 1 and 65536"));
        }
        if self.model_name.is_empty() {
            return Err(err("model_name", "must not be empty"));
        }
        if self.adapters.len() > MAX_ADAPTERS {
            return Err(err("adapters", format!("at most {MAX_ADAPTERS} adapters")));
        }
        for (i, a) in self.adapters.iter().enumerate() {
            if a.is_empty() || *a == self.model_name || self.adapters[..i].contains(a) {
                return Err(err(
                    &format!("adapters[{i}]"),
                    format!("'{a}' must be a non-empty name, unique, and not the model's"),
                ));
            }
        }
        if self.aliases.len() > MAX_ADAPTERS {
            return Err(err("aliases", format!("at most {MAX_ADAPTERS} names")));
        }
        for (i, a) in self.aliases.iter().enumerate() {
            if a.is_empty()
                || *a == self.model_name
                || self.adapters.contains(a)
                || self.aliases[..i].contains(a)
            {
                return Err(err(
                    &format!("aliases[{i}]"),
                    format!("'{a}' must be a non-empty name, unique, and neither the model's nor an adapter's"),
                ));
            }
        }
        if !(64..=64 * 1024 * 1024).contains(&self.max_body_bytes) {
            return Err(err("max_body_bytes", "must be between 64 and 67108864"));
        }
        if let Some(c) = &self.pod_credentials {
            let token = |s: &str| {
                !s.is_empty()
                    && s.bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
            };
            if !token(&c.value_from_env) {
                return Err(err(
                    "pod_credentials.value_from_env",
                    "must name an environment variable (letters, digits, _ . -)",
                ));
            }
            if !token(&c.header) || c.header.bytes().any(|b| b.is_ascii_uppercase()) {
                return Err(err(
                    "pod_credentials.header",
                    "must be a lower-case header name",
                ));
            }
        }
        if let Some(e) = &self.events {
            if e.port.is_none() && e.addresses.is_empty() {
                return Err(err(
                    "events",
                    "give the sidecars' `port`, or their `addresses`",
                ));
            }
            if e.port == Some(0) {
                return Err(err("events.port", "must be a port (1-65535)"));
            }
            if let Some(bad) = e
                .addresses
                .keys()
                .find(|k| k.parse::<SocketAddr>().is_err())
            {
                return Err(err(
                    &format!("events.addresses.{bad}"),
                    "keys are pod addresses (ip:port)",
                ));
            }
        }
        if !(1..=1 << 24).contains(&self.max_prompt_tokens) {
            return Err(err("max_prompt_tokens", "must be between 1 and 16777216"));
        }
        if !(1..=16 * 1024 * 1024).contains(&self.table_capacity) {
            return Err(err("table_capacity", "must be between 1 and 16777216"));
        }
        if self.poll_interval_ms != 0 && !(50..=60_000).contains(&self.poll_interval_ms) {
            return Err(err(
                "poll_interval_ms",
                "must be 0 (off) or between 50 and 60000",
            ));
        }
        if self.down_after_failures == 0 {
            return Err(err("down_after_failures", "must be at least 1"));
        }
        if self.cluster.is_empty() {
            return Err(err("cluster", "must not be empty"));
        }
        if self.route_cluster.is_empty() {
            return Err(err("route_cluster", "must not be empty"));
        }
        let w = &self.weights;
        for (name, v) in [
            ("weights.prefix", w.prefix),
            ("weights.inflight", w.inflight),
            ("weights.waiting", w.waiting),
            ("weights.kv_cache", w.kv_cache),
            ("weights.imbalance_abs", w.imbalance_abs),
            ("weights.imbalance_ratio", w.imbalance_ratio),
            ("weights.cold_slack", w.cold_slack),
        ] {
            if !(v.is_finite() && v >= 0.0) {
                return Err(err(name, "must be a finite number ≥ 0"));
            }
        }
        let c = &self.cost;
        for (name, v) in [
            ("cost.base_ms", c.base_ms),
            ("cost.prefill_us_per_token", c.prefill_us_per_token),
            ("cost.service_ms", c.service_ms),
        ] {
            if !(v.is_finite() && v >= 0.0) {
                return Err(err(name, "must be a finite number ≥ 0"));
            }
        }
        if c.slots == 0 {
            return Err(err("cost.slots", "must be at least 1"));
        }
        Ok(())
    }

    /// The configured pod addresses, in order (a pod's index is its position here).
    pub fn pod_addrs(&self) -> impl Iterator<Item = &str> {
        self.pods.iter().map(PodAddr::as_str)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults() {
        let c = RouterConfig::parse(br#"{"pods":["127.0.0.1:8001"]}"#).unwrap();
        assert_eq!(c.block_size.get(), defaults::BLOCK_SIZE);
        assert_eq!(c.model_name, defaults::MODEL_NAME);
        assert_eq!(c.max_body_bytes, defaults::MAX_BODY_BYTES);
        assert!(!c.debug_headers);
        assert_eq!(c.policy, Policy::Prefix);
        assert_eq!(c.pod_addrs().collect::<Vec<_>>(), ["127.0.0.1:8001"]);
        let c = RouterConfig::parse(
            br#"{"pods":["127.0.0.1:1"],"policy":"least_loaded","weights":{"prefix":3}}"#,
        )
        .unwrap();
        assert_eq!(c.policy, Policy::LeastLoaded);
        assert_eq!(c.weights.prefix, 3.0);
        assert_eq!(c.weights.inflight, 1.0);
        // `cost`, a policy of its own until it was folded into `prefix`, still reads
        let c = RouterConfig::parse(br#"{"pods":["127.0.0.1:1"],"policy":"cost"}"#).unwrap();
        assert_eq!(c.policy, Policy::Prefix);
        let t = RouterConfig::parse(br#"{"pods":["1.2.3.4:5"],"tokenizer":{"cluster":"assets"}}"#)
            .unwrap()
            .tokenizer
            .unwrap();
        assert_eq!(
            (t.path.as_str(), t.config_path.as_deref(), t.timeout_ms),
            ("/tokenizer.json", Some("/tokenizer_config.json"), 10_000)
        );
        let c = RouterConfig::parse(br#"{"discovery":{}}"#).unwrap();
        let d = c.discovery.unwrap();
        assert_eq!(
            (d.cluster.as_str(), d.admin_cluster.as_str()),
            ("pods", "envoy_admin")
        );
        assert!(c.pods.is_empty(), "no pods until Envoy answers");
    }

    #[test]
    fn bad_values_are_named_by_their_path() {
        for (json, field) in [
            (r#"{"pods":[]}"#, "pods"),
            (r#"{}"#, "pods"),
            (r#"{"pods":["localhost"]}"#, "pods[0]"),
            (r#"{"pods":["127.0.0.1:1","127.0.0.1"]}"#, "pods[1]"),
            (r#"{"pods":"x"}"#, "pods"),
            (r#"{"pods":["127.0.0.1:1"],"block_size":0}"#, "block_size"),
            (
                r#"{"pods":["127.0.0.1:1"],"block_size":70000}"#,
                "block_size",
            ),
            (
                r#"{"pods":["127.0.0.1:1"],"block_size":"big"}"#,
                "block_size",
            ),
            (
                r#"{"pods":["127.0.0.1:1"],"table_capacity":0}"#,
                "table_capacity",
            ),
            (
                r#"{"pods":["127.0.0.1:1"],"max_body_bytes":1}"#,
                "max_body_bytes",
            ),
            (r#"{"pods":["127.0.0.1:1"],"model_name":""}"#, "model_name"),
            (r#"{"pods":["127.0.0.1:1"],"podz":1}"#, "podz"),
            (
                r#"{"pods":["127.0.0.1:1"],"poll_interval_ms":5}"#,
                "poll_interval_ms",
            ),
            (
                r#"{"pods":["127.0.0.1:1"],"weights":{"prefix":-1}}"#,
                "weights.prefix",
            ),
            (
                r#"{"pods":["127.0.0.1:1"],"weights":{"prefx":1}}"#,
                "weights.prefx",
            ),
            (
                r#"{"pods":["127.0.0.1:1"],"cost":{"service_ms":-3}}"#,
                "cost.service_ms",
            ),
            (
                r#"{"pods":["127.0.0.1:1"],"cost":{"slots":0}}"#,
                "cost.slots",
            ),
            (r#"{"pods":["127.0.0.1:1"],"policy":"fastest"}"#, "policy"),
            (
                r#"{"pods":["127.0.0.1:1"],"down_after_failures":0}"#,
                "down_after_failures",
            ),
            (r#"{"pods":["127.0.0.1:1"],"cluster":""}"#, "cluster"),
            (r#"{"discovery":{"cluster":""}}"#, "discovery.cluster"),
            (r#"{"discovery":{"admin":"x"}}"#, "discovery.admin"),
            (r#"{"discovery":{},"poll_interval_ms":0}"#, "discovery"),
            (r#"{"pods":["1.2.3.4:5"],"tokenizer":{}}"#, "tokenizer"),
            (
                r#"{"pods":["1.2.3.4:5"],"adapters":["a","a"]}"#,
                "adapters[1]",
            ),
            (
                r#"{"pods":["1.2.3.4:5"],"model_name":"m","adapters":["m"]}"#,
                "adapters[0]",
            ),
            (
                r#"{"pods":["1.2.3.4:5"],"model_name":"m","aliases":["m"]}"#,
                "aliases[0]",
            ),
            (
                r#"{"pods":["1.2.3.4:5"],"adapters":["x"],"aliases":["y","x"]}"#,
                "aliases[1]",
            ),
            (
                r#"{"pods":["1.2.3.4:5"],"pod_credentials":{"value_from_env":""}}"#,
                "pod_credentials.value_from_env",
            ),
            (r#"{"pods":["1.2.3.4:5"],"events":{}}"#, "events"),
            (
                r#"{"pods":["1.2.3.4:5"],"events":{"port":0}}"#,
                "events.port",
            ),
            (
                r#"{"pods":["1.2.3.4:5"],"events":{"addresses":{"pod-a":"1.2.3.4:6"}}}"#,
                "events.addresses.pod-a",
            ),
            (
                r#"{"pods":["1.2.3.4:5"],"events":{"addresses":{"1.2.3.4:5":"nowhere"}}}"#,
                "events.addresses.1.2.3.4:5",
            ),
            (
                r#"{"pods":["1.2.3.4:5"],"tokenizer":{"cluster":""}}"#,
                "tokenizer.cluster",
            ),
            (
                r#"{"pods":["1.2.3.4:5"],"tokenizer":{"cluster":"a","path":"t.json"}}"#,
                "tokenizer.path",
            ),
            (
                r#"{"pods":["1.2.3.4:5"],"tokenizer":{"cluster":"a","timeout_ms":5}}"#,
                "tokenizer.timeout_ms",
            ),
        ] {
            let e = RouterConfig::parse(json.as_bytes()).unwrap_err();
            assert_eq!(e.field, field, "{json}: {e}");
            assert!(e.to_string().contains(&format!("'{field}'")), "{e}");
        }
    }

    #[test]
    fn events_are_asked_where_the_config_says() {
        let c = |json: &str| RouterConfig::parse(json.as_bytes()).map_err(|e| e.to_string());
        let plain = c(r#"{"pods":["10.0.0.1:8000"]}"#).unwrap();
        assert_eq!(plain.events_addr("10.0.0.1:8000"), "10.0.0.1:8000");
        let sidecars = c(r#"{"pods":["10.0.0.1:8000","127.0.0.1:8001"],
                "events":{"port":8100,"addresses":{"127.0.0.1:8001":"127.0.0.1:9001"}}}"#)
        .unwrap();
        assert_eq!(sidecars.events_addr("10.0.0.1:8000"), "10.0.0.1:8100");
        assert_eq!(sidecars.events_addr("127.0.0.1:8001"), "127.0.0.1:9001");
        assert_eq!(sidecars.events_addr("[::1]:8000"), "[::1]:8100");
    }
}
