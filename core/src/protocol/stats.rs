//! How the filter's metrics are named, and how Envoy turns parts of a name into labels.
//!
//! Wasm metrics have no labels: a per-pod gauge carries the pod's address in its name,
//! `prefix_router_pod.<ip:port>.<gauge>`, and a decision counter its reason and model,
//! `prefix_router_decisions.<reason>.<model>`, and a per-model gauge its model,
//! `prefix_router_members.<model>`. The Envoy config (written by
//! `render-envoy-config`) has the stats tags of [`STATS_TAGS`], which cut those parts out of
//! the names into tags, so Prometheus sees `prefix_router_pod_healthy{pod="10.0.0.5:8000"}`
//! and `prefix_router_decisions{reason="prefix_hit",model="…"}`, which dashboards and rules
//! group and join on. An Envoy config without the tags still works; its names then read
//! `prefix_router_pod_10_0_0_5_8000_healthy`.

/// Name of one per-pod gauge (`healthy`, `inflight`, `event_lag_ms`, `signals`) of the pod at
/// `addr`, as the filter defines it.
pub fn pod_stat_name(addr: &str, gauge: &str) -> String {
    format!("prefix_router_pod.{addr}.{gauge}")
}

/// Name of the decision counter for a reason (`prefix_hit`) and the request's model.
pub fn decision_stat_name(reason: &str, model: &str) -> String {
    format!("prefix_router_decisions.{reason}.{model}")
}

/// The per-model gauges: each model's pods, tokenizer and ownership table are its own.
pub const MODEL_GAUGES: [&str; 3] = ["members", "tokenizer_loaded", "table_entries"];

/// Name of a per-model gauge (one of [`MODEL_GAUGES`]) of the model `model`:
/// `prefix_router_members.<model>` is `prefix_router_members{model="…"}` in Prometheus.
pub fn model_stat_name(gauge: &str, model: &str) -> String {
    format!("prefix_router_{gauge}.{model}")
}

/// Envoy stats tags (`stats_config.stats_tags`: name, regex). In each regex the first group
/// is cut from the stat's name and the second is the tag's value; every regex is matched
/// against the whole name (Envoy keeps wasm metrics under `wasmcustom.`).
pub const STATS_TAGS: [(&str, &str); 3] = [
    ("pod", r"^wasmcustom\.prefix_router_pod\.((.+)\.)[a-z_]+$"),
    (
        "reason",
        r"^wasmcustom\.prefix_router_decisions(\.([a-z_]+))\.",
    ),
    (
        "model",
        r"^wasmcustom\.prefix_router_(?:decisions\.[a-z_]+|members|tokenizer_loaded|table_entries)(\.(.+))$",
    ),
];

#[cfg(test)]
mod tests {
    use super::*;

    /// What Envoy does with the tags: every regex on the whole name; the first groups leave
    /// the name, the second groups are the values.
    fn extract(full: &str) -> (String, Vec<(&'static str, String)>) {
        let mut cut = vec![false; full.len()];
        let mut tags = Vec::new();
        for (tag, regex) in STATS_TAGS {
            let re = regex::Regex::new(regex).unwrap();
            if let Some(c) = re.captures(full) {
                let (g1, g2) = (c.get(1).unwrap(), c.get(2).unwrap());
                cut[g1.range()].iter_mut().for_each(|x| *x = true);
                tags.push((tag, g2.as_str().to_owned()));
            }
        }
        let name = full
            .char_indices()
            .filter(|(i, _)| !cut[*i])
            .map(|(_, c)| c)
            .collect();
        (name, tags)
    }

    #[test]
    fn the_pod_tag_takes_the_whole_address() {
        for addr in ["10.0.0.5:8000", "127.0.0.1:18001", "[::1]:8000"] {
            let full = format!("wasmcustom.{}", pod_stat_name(addr, "event_lag_ms"));
            assert_eq!(
                extract(&full),
                (
                    "wasmcustom.prefix_router_pod.event_lag_ms".to_owned(),
                    vec![("pod", addr.to_owned())]
                )
            );
        }
    }

    #[test]
    fn decisions_get_reason_and_model() {
        for model in ["SmolLM2-135M-Instruct", "Qwen2.5-7B", "org/model:lora.v1"] {
            let full = format!("wasmcustom.{}", decision_stat_name("prefix_hit", model));
            assert_eq!(
                extract(&full),
                (
                    "wasmcustom.prefix_router_decisions".to_owned(),
                    vec![
                        ("reason", "prefix_hit".to_owned()),
                        ("model", model.to_owned())
                    ]
                )
            );
        }
    }

    #[test]
    fn model_gauges_get_the_model() {
        for gauge in MODEL_GAUGES {
            let full = format!("wasmcustom.{}", model_stat_name(gauge, "Qwen2.5-0.5B"));
            assert_eq!(
                extract(&full),
                (
                    format!("wasmcustom.prefix_router_{gauge}"),
                    vec![("model", "Qwen2.5-0.5B".to_owned())]
                )
            );
        }
    }

    #[test]
    fn other_stats_keep_their_names() {
        for name in [
            "wasmcustom.prefix_router_pod_generation_changes",
            "wasmcustom.prefix_router_matched_blocks",
            "wasmcustom.prefix_router_membership_changes",
            "cluster.pods.upstream_rq_retry",
        ] {
            assert_eq!(extract(name), (name.to_owned(), vec![]));
        }
    }
}
