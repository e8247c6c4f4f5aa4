//! A Kubernetes ConfigMap holding one file: how the Envoy configuration (and, for the
//! shipped overlays, the observability rules and dashboards) reaches a cluster.

use serde_json::{json, Value};

/// A ConfigMap holding one file.
pub fn configmap(
    name: &str,
    namespace: Option<&str>,
    labels: &[(&str, &str)],
    key: &str,
    content: &str,
    source: &str,
) -> anyhow::Result<String> {
    let mut meta = json!({"name": name});
    if let Some(ns) = namespace {
        meta["namespace"] = json!(ns);
    }
    let mut l = serde_json::Map::new();
    l.insert("app.kubernetes.io/part-of".into(), json!("prefix-router"));
    for (k, v) in labels {
        l.insert((*k).into(), json!(v));
    }
    meta["labels"] = Value::Object(l);
    let doc = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta,
                     "data": {key: content}});
    Ok(format!(
        "# Rendered from {source}: do not edit by hand.\n{}",
        serde_norway::to_string(&doc)?
    ))
}
