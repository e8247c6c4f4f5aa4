//! The whole plugin configuration: the models one filter routes for.
//!
//! A document without `models` is one model's [`RouterConfig`], as it always was. With
//! `models`, each entry is a model's own `RouterConfig` (its pods or discovery, tokenizer,
//! block size, adapters, route cluster) and every field the entry leaves out is taken from
//! the top level, so settings shared by all models are written once. Four fields live only at
//! the top level: `max_body_bytes`, `debug_headers` and `inference_paths` apply before the
//! request's model is known, and `poll_interval_ms` is one timer for every model's polls.
//!
//! `unknown_model` says what happens to a request naming a model no entry serves (neither a
//! `model_name` nor an adapter): `"reject"` (the default) answers 404 `model_not_found` as
//! the servers do; a model's name sends such requests to that model's pool, balanced by load
//! (for pods that serve more than the filter is told about). A request naming no model goes
//! to the first entry, as a server serving several models treats its first as the default.

use crate::router_config::{err, ConfigError, RouterConfig};
use serde_json::{Map, Value};

/// Most models one filter routes for.
pub const MAX_MODELS: usize = 64;

/// Fields that apply before the request's model is known, or to the whole VM (one timer
/// drives every model's polls): top level only.
const TOP_LEVEL_ONLY: [&str; 4] = [
    "max_body_bytes",
    "debug_headers",
    "poll_interval_ms",
    "inference_paths",
];

/// What a request naming a model that no entry serves gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UnknownModel {
    /// 404 `model_not_found` from the filter.
    Reject,
    /// Routed by load to this model's pool (an index into [`PluginConfig::models`]).
    RouteTo(usize),
}

/// The validated plugin configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct PluginConfig {
    /// At least one; a request naming no model goes to the first.
    pub models: Vec<RouterConfig>,
    pub unknown_model: UnknownModel,
    /// Written with `models`: each request's route cluster is named in
    /// [`crate::protocol::headers::ROUTE_CLUSTER`].
    pub several: bool,
}

/// Which model a request is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModelChoice {
    /// Served by this entry (its base model or one of its adapters, or no model named).
    Served(usize),
    /// Not served here; `unknown_model` sends it to this entry's pool, by load.
    Unknown(usize),
    /// Not served here, and `unknown_model` is `reject`.
    Rejected,
}

impl PluginConfig {
    /// Parses and validates the plugin configuration bytes; a bad value is named by its path
    /// (`models[1].block_size`, `unknown_model`).
    pub fn parse(bytes: &[u8]) -> Result<Self, ConfigError> {
        let doc: Value =
            serde_json::from_slice(bytes).map_err(|e| err(".", format!("not JSON: {e}")))?;
        let Some(top) = doc.as_object() else {
            return Err(err(".", "must be a JSON object"));
        };
        let Some(list) = top.get("models") else {
            return Ok(PluginConfig {
                models: vec![RouterConfig::parse(bytes)?],
                unknown_model: UnknownModel::Reject,
                several: false,
            });
        };
        let mut shared = top.clone();
        shared.remove("models");
        let unknown = shared.remove("unknown_model");
        let entries = match list.as_array() {
            Some(l) if !l.is_empty() && l.len() <= MAX_MODELS => l,
            _ => return Err(err("models", format!("must list 1 to {MAX_MODELS} models"))),
        };
        let mut models = Vec::with_capacity(entries.len());
        for (i, entry) in entries.iter().enumerate() {
            models.push(parse_entry(i, entry, &shared)?);
        }
        check_names(&models)?;
        let unknown_model = match unknown.as_ref() {
            None => UnknownModel::Reject,
            Some(Value::String(s)) if s == "reject" => UnknownModel::Reject,
            Some(Value::String(s)) => match models.iter().position(|m| m.model_name == *s) {
                Some(i) => UnknownModel::RouteTo(i),
                None => {
                    return Err(err(
                        "unknown_model",
                        format!("'{s}' is not the model_name of one of `models`"),
                    ))
                }
            },
            Some(_) => {
                return Err(err(
                    "unknown_model",
                    "must be \"reject\" or the model_name of one of `models`",
                ))
            }
        };
        Ok(PluginConfig {
            models,
            unknown_model,
            several: true,
        })
    }

    /// The entry serving the request's `model` (`None`: the request names none).
    pub fn choose(&self, model: Option<&str>) -> ModelChoice {
        let Some(name) = model else {
            return ModelChoice::Served(0);
        };
        let serves = |c: &RouterConfig| {
            c.model_name == name
                || c.aliases.iter().any(|a| a == name)
                || c.adapters.iter().any(|a| a == name)
        };
        match (self.models.iter().position(serves), self.unknown_model) {
            (Some(i), _) => ModelChoice::Served(i),
            (None, UnknownModel::RouteTo(i)) => ModelChoice::Unknown(i),
            (None, UnknownModel::Reject) => ModelChoice::Rejected,
        }
    }

    /// The body limit (a top-level setting: it is checked before the model is known).
    pub fn max_body_bytes(&self) -> usize {
        self.models.first().map_or(0, |m| m.max_body_bytes)
    }

    /// How often pods are polled (a top-level setting; 0: never).
    pub fn poll_interval_ms(&self) -> u64 {
        self.models.first().map_or(0, |m| m.poll_interval_ms)
    }

    /// How a POST to `path` is routed (a top-level setting: the path is seen before the
    /// body names the model). `None`: not an inference path.
    pub fn path_kind(&self, path: &str) -> Option<crate::request::PathKind> {
        let none = std::collections::BTreeMap::new();
        let declared = self.models.first().map_or(&none, |m| &m.inference_paths);
        crate::request::PathKind::of(path, declared)
    }

    /// Whether responses carry the `x-prefix-router-*` debug headers.
    pub fn debug_headers(&self) -> bool {
        self.models.first().is_some_and(|m| m.debug_headers)
    }
}

/// One `models` entry, with the top level's fields for those it leaves out.
fn parse_entry(
    i: usize,
    entry: &Value,
    shared: &Map<String, Value>,
) -> Result<RouterConfig, ConfigError> {
    let at = |field: &str| format!("models[{i}].{field}");
    let Some(own) = entry.as_object() else {
        return Err(err(&format!("models[{i}]"), "must be an object"));
    };
    if let Some(f) = TOP_LEVEL_ONLY.iter().find(|f| own.contains_key(**f)) {
        return Err(err(
            &at(f),
            "applies before the request's model is known: set it at the top level",
        ));
    }
    let mut merged = shared.clone();
    merged.extend(own.clone());
    let bytes =
        serde_json::to_vec(&Value::Object(merged)).map_err(|e| err(&at(""), e.to_string()))?;
    RouterConfig::parse(&bytes).map_err(|e| {
        // a field the entry wrote is the entry's; one it took from the top level is not
        let head = e.field.split(['.', '[']).next().unwrap_or_default();
        if own.contains_key(head) || !shared.contains_key(head) {
            ConfigError {
                field: at(&e.field),
                ..e
            }
        } else {
            e
        }
    })
}

/// Every model and adapter name is served by one entry only.
fn check_names(models: &[RouterConfig]) -> Result<(), ConfigError> {
    let mut seen: Vec<&str> = Vec::new();
    for (i, m) in models.iter().enumerate() {
        for name in std::iter::once(&m.model_name).chain(&m.adapters) {
            if seen.contains(&name.as_str()) {
                return Err(err(
                    &format!("models[{i}].model_name"),
                    format!("'{name}' is served by an earlier entry too"),
                ));
            }
            seen.push(name);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(json: &str) -> Result<PluginConfig, ConfigError> {
        PluginConfig::parse(json.as_bytes())
    }

    #[test]
    fn one_model_documents_are_read_as_before() {
        let c = parse(r#"{"pods":["127.0.0.1:8001"],"model_name":"a"}"#).unwrap();
        assert!(!c.several);
        assert_eq!(c.models.len(), 1);
        assert_eq!(c.models[0].route_cluster, "pods");
        assert_eq!(c.choose(Some("a")), ModelChoice::Served(0));
        assert_eq!(c.choose(None), ModelChoice::Served(0));
        assert_eq!(c.choose(Some("b")), ModelChoice::Rejected);
    }

    #[test]
    fn entries_take_what_they_leave_out_from_the_top_level() {
        let c = parse(
            r#"{"poll_interval_ms":250,"block_size":16,"max_body_bytes":4096,"debug_headers":true,
                "models":[
                  {"model_name":"a","pods":["127.0.0.1:8001"]},
                  {"model_name":"b","pods":["127.0.0.1:9001"],"block_size":32,
                   "adapters":["b-sql"],"aliases":["b-latest"],"route_cluster":"pods_b"}],
                "unknown_model":"b"}"#,
        )
        .unwrap();
        assert!(c.several);
        let (a, b) = (&c.models[0], &c.models[1]);
        assert_eq!((a.block_size.get(), b.block_size.get()), (16, 32));
        assert_eq!((a.poll_interval_ms, b.poll_interval_ms), (250, 250));
        assert_eq!(
            (a.route_cluster.as_str(), b.route_cluster.as_str()),
            ("pods", "pods_b")
        );
        assert_eq!((c.max_body_bytes(), c.debug_headers()), (4096, true));
        assert_eq!(c.choose(Some("a")), ModelChoice::Served(0));
        assert_eq!(c.choose(Some("b-sql")), ModelChoice::Served(1));
        assert_eq!(c.choose(Some("b-latest")), ModelChoice::Served(1));
        assert_eq!(c.choose(None), ModelChoice::Served(0));
        assert_eq!(c.choose(Some("zzz")), ModelChoice::Unknown(1));
        let reject = parse(r#"{"models":[{"pods":["127.0.0.1:1"]}],"unknown_model":"reject"}"#);
        assert_eq!(reject.unwrap().choose(Some("zzz")), ModelChoice::Rejected);
    }

    #[test]
    fn bad_values_are_named_by_their_path() {
        for (json, field) in [
            (r#"{"models":[]}"#, "models"),
            (r#"{"models":{}}"#, "models"),
            (r#"{"models":[1]}"#, "models[0]"),
            (
                r#"{"models":[{"pods":["127.0.0.1:1"]},{"pods":[]}]}"#,
                "models[1].pods",
            ),
            (
                r#"{"models":[{"pods":["127.0.0.1:1"],"block_size":0}]}"#,
                "models[0].block_size",
            ),
            // a bad shared value is the top level's
            (
                r#"{"block_size":0,"models":[{"pods":["127.0.0.1:1"]}]}"#,
                "block_size",
            ),
            (
                r#"{"models":[{"pods":["127.0.0.1:1"],"max_body_bytes":100}]}"#,
                "models[0].max_body_bytes",
            ),
            (
                r#"{"models":[{"pods":["127.0.0.1:1"],"poll_interval_ms":100}]}"#,
                "models[0].poll_interval_ms",
            ),
            (
                r#"{"models":[{"pods":["127.0.0.1:1"]},{"pods":["127.0.0.1:2"]}]}"#,
                "models[1].model_name",
            ),
            (
                r#"{"models":[{"pods":["127.0.0.1:1"],"model_name":"a"},{"pods":["127.0.0.1:2"],"model_name":"b","adapters":["a"]}]}"#,
                "models[1].model_name",
            ),
            (
                r#"{"models":[{"pods":["127.0.0.1:1"]}],"unknown_model":"x"}"#,
                "unknown_model",
            ),
            (
                r#"{"models":[{"pods":["127.0.0.1:1"]}],"unknown_model":1}"#,
                "unknown_model",
            ),
            (r#"[1]"#, "."),
            (r#"nope"#, "."),
        ] {
            let e = parse(json).unwrap_err();
            assert_eq!(e.field, field, "{json}: {e}");
        }
    }
}
