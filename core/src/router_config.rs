//! The routing filter's plugin configuration: typed, validated once, errors name the field.

use crate::block::DEFAULT_BLOCK_SIZE;
use crate::policy::{Policy, Weights};
use serde::Deserialize;
use std::net::SocketAddr;

/// Header that carries the chosen upstream (`host:port`) to Envoy's ORIGINAL_DST cluster; the
/// same header the Gateway API Inference Extension uses.
pub const DESTINATION_HEADER: &str = "x-gateway-destination-endpoint";

/// Plugin configuration (JSON in the Envoy wasm filter's `configuration`).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RouterConfig {
    /// Model-server pods as `ip:port`.
    pub pods: Vec<String>,
    /// Prefix-cache block size in tokens; must equal the servers' `--block-size`.
    #[serde(default = "default_block_size")]
    pub block_size: u32,
    /// Served model name; seeds the block hashes exactly as the servers do.
    #[serde(default = "default_model_name")]
    pub model_name: String,
    /// Largest request body the filter buffers; larger bodies get 413.
    #[serde(default = "default_max_body_bytes")]
    pub max_body_bytes: usize,
    /// Add `x-prefix-router-*` response headers (pod, reason, matched blocks).
    #[serde(default)]
    pub debug_headers: bool,
    /// Entries in the ownership table (two per shared-data key; memory stays bounded).
    #[serde(default = "default_table_capacity")]
    pub table_capacity: u64,
    /// `prefix` (default), `round_robin`, `random` or `least_loaded`.
    #[serde(default)]
    pub policy: Policy,
    /// Weights of the prefix policy.
    #[serde(default)]
    pub weights: Weights,
    /// How often pods are polled for health, load and cache events (0 disables polling).
    #[serde(default = "default_poll_interval_ms")]
    pub poll_interval_ms: u64,
    /// Consecutive failed polls after which a pod is marked down.
    #[serde(default = "default_down_after_failures")]
    pub down_after_failures: u32,
    /// Envoy cluster the poller calls pods through (ORIGINAL_DST on the destination header).
    #[serde(default = "default_cluster")]
    pub cluster: String,
}

fn default_poll_interval_ms() -> u64 {
    500
}
fn default_down_after_failures() -> u32 {
    2
}
fn default_cluster() -> String {
    "pods".to_owned()
}

fn default_block_size() -> u32 {
    DEFAULT_BLOCK_SIZE
}
fn default_model_name() -> String {
    "SmolLM2-135M-Instruct".to_owned()
}
fn default_max_body_bytes() -> usize {
    4 * 1024 * 1024
}
fn default_table_capacity() -> u64 {
    65_536
}

/// A configuration that cannot work.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("invalid prefix-router configuration: field '{field}': {reason}")]
pub struct ConfigError {
    pub field: String,
    pub reason: String,
}

fn err(field: &str, reason: impl Into<String>) -> ConfigError {
    ConfigError {
        field: field.to_owned(),
        reason: reason.into(),
    }
}

impl RouterConfig {
    /// Parses and validates the plugin configuration bytes.
    pub fn parse(bytes: &[u8]) -> Result<Self, ConfigError> {
        let c: RouterConfig = serde_json::from_slice(bytes).map_err(|e| {
            // serde names unknown/missing fields in its message
            let msg = e.to_string();
            let field = msg
                .split('`')
                .nth(1)
                .filter(|_| msg.contains("field"))
                .unwrap_or("(json)")
                .to_owned();
            ConfigError { field, reason: msg }
        })?;
        c.validate()?;
        Ok(c)
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.pods.is_empty() {
            return Err(err("pods", "at least one pod (ip:port) is required"));
        }
        if self.pods.len() > 1024 {
            return Err(err("pods", "at most 1024 pods"));
        }
        for (i, p) in self.pods.iter().enumerate() {
            if p.parse::<SocketAddr>().is_err() {
                return Err(err(
                    &format!("pods[{i}]"),
                    format!("'{p}' is not an ip:port address"),
                ));
            }
        }
        if self.block_size == 0 || self.block_size > 65_536 {
            return Err(err("block_size", "must be between 1 and 65536"));
        }
        if self.model_name.is_empty() {
            return Err(err("model_name", "must not be empty"));
        }
        if !(64..=64 * 1024 * 1024).contains(&self.max_body_bytes) {
            return Err(err("max_body_bytes", "must be between 64 and 67108864"));
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
        let w = &self.weights;
        for (name, v) in [
            ("weights.prefix", w.prefix),
            ("weights.inflight", w.inflight),
            ("weights.waiting", w.waiting),
            ("weights.kv_cache", w.kv_cache),
            ("weights.imbalance_abs", w.imbalance_abs),
            ("weights.imbalance_ratio", w.imbalance_ratio),
        ] {
            if !(v.is_finite() && v >= 0.0) {
                return Err(err(name, "must be a finite number ≥ 0"));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_and_validation() {
        let c = RouterConfig::parse(br#"{"pods":["127.0.0.1:8001"]}"#).unwrap();
        assert_eq!(c.block_size, 128);
        assert_eq!(c.model_name, "SmolLM2-135M-Instruct");
        assert!(!c.debug_headers);
        assert_eq!(c.policy, Policy::Prefix);
        let c = RouterConfig::parse(
            br#"{"pods":["127.0.0.1:1"],"policy":"least_loaded","weights":{"prefix":3}}"#,
        )
        .unwrap();
        assert_eq!(c.policy, Policy::LeastLoaded);
        assert_eq!(c.weights.prefix, 3.0);
        assert_eq!(c.weights.inflight, 1.0);
        for (json, field) in [
            (r#"{"pods":[]}"#, "pods"),
            (r#"{"pods":["localhost"]}"#, "pods[0]"),
            (r#"{"pods":["127.0.0.1:1"],"block_size":0}"#, "block_size"),
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
            (r#"{}"#, "pods"),
            (r#"{"pods":"x"}"#, "(json)"),
            (
                r#"{"pods":["127.0.0.1:1"],"poll_interval_ms":5}"#,
                "poll_interval_ms",
            ),
            (
                r#"{"pods":["127.0.0.1:1"],"weights":{"prefix":-1}}"#,
                "weights.prefix",
            ),
            (r#"{"pods":["127.0.0.1:1"],"policy":"fastest"}"#, "(json)"),
        ] {
            let e = RouterConfig::parse(json.as_bytes()).unwrap_err();
            assert_eq!(e.field, field, "{json}: {e}");
            assert!(e.to_string().contains(field));
        }
    }
}
