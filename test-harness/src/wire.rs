//! Reading what the processes answer, with the crates made for it: Prometheus text
//! exposition (`prom_text_format_parser`; the better-known `prometheus-parse` rejects the `:`
//! in vLLM's metric names) and server-sent events (`eventsource-stream`).

use eventsource_stream::Eventsource;
use futures::StreamExt;

/// The value of series `name` in a Prometheus text exposition, summed over its label sets:
/// a counter or gauge, or a histogram's `_count` / `_sum`; `name{key="value"}` sums only the
/// samples with that label. `None` when there is no such metric (or the text does not parse).
pub fn metric_value(text: &str, name: &str) -> Option<f64> {
    use prom_text_format_parser::{parse_scrape, ValueType};
    // Envoy writes an empty label set (`name{} 1`), which the text format allows and this
    // parser rejects (then returning nothing): drop it first.
    let (metrics, _error) = parse_scrape(&text.replace("{} ", " "));
    // `name{key="value"}`: only the samples with that label
    let (name, want) = match name.split_once('{') {
        Some((n, sel)) => {
            let sel = sel.trim_end_matches('}');
            let (k, v) = sel.split_once('=')?;
            (n, Some((k, v.trim_matches('"'))))
        }
        None => (name, None),
    };
    let (base, kind) = [("_count", ValueType::Count), ("_sum", ValueType::Sum)]
        .into_iter()
        .find_map(|(suffix, kind)| {
            let base = name.strip_suffix(suffix)?;
            metrics
                .iter()
                .any(|m| m.name == base)
                .then_some((base, kind))
        })
        .unwrap_or((name, ValueType::Sample));
    let metric = metrics.iter().find(|m| m.name == base)?;
    Some(
        metric
            .samples
            .iter()
            .filter(|s| s.value.value_type == kind)
            .filter(|s| {
                want.is_none_or(|(k, v)| s.labels.iter().any(|l| l.key == k && l.value == v))
            })
            .map(|s| s.value.value.as_f64())
            .sum(),
    )
}

/// The `data` of every event of a whole SSE body, in order.
pub fn sse_data(body: &[u8]) -> Vec<String> {
    let bytes = futures::stream::iter([Ok::<_, std::convert::Infallible>(body.to_vec())]);
    futures::executor::block_on(
        bytes
            .eventsource()
            .filter_map(|e| async move { e.ok().map(|e| e.data) })
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_colon_names_labels_and_sums() {
        let text = "# HELP vllm:prefix_cache_hits_total hits\n# TYPE vllm:prefix_cache_hits_total counter\nvllm:prefix_cache_hits_total{model_name=\"m\",pod=\"a\"} 128\nvllm:prefix_cache_hits_total{model_name=\"m\",pod=\"b\"} 256\nprefix_router_decisions{reason=\"cold\"} 3\n";
        assert_eq!(
            metric_value(text, "vllm:prefix_cache_hits_total"),
            Some(384.0)
        );
        assert_eq!(metric_value(text, "prefix_router_decisions"), Some(3.0));
        assert_eq!(metric_value(text, "missing"), None);
        assert_eq!(
            metric_value(text, "vllm:prefix_cache_hits_total{pod=\"b\"}"),
            Some(256.0)
        );
        let histogram = "# TYPE t_seconds histogram\nt_seconds_bucket{pod=\"a\",le=\"1\"} 2\nt_seconds_bucket{pod=\"a\",le=\"+Inf\"} 3\nt_seconds_sum{pod=\"a\"} 1.5\nt_seconds_count{pod=\"a\"} 3\nt_seconds_count{pod=\"b\"} 4\n";
        assert_eq!(metric_value(histogram, "t_seconds_count"), Some(7.0));
        assert_eq!(metric_value(histogram, "t_seconds_sum"), Some(1.5));
        assert_eq!(
            metric_value(histogram, "t_seconds_count{pod=\"b\"}"),
            Some(4.0)
        );
    }

    #[test]
    fn reads_events() {
        let body = b"data: {\"a\":1}\n\ndata: [DONE]\n\n";
        assert_eq!(sse_data(body), ["{\"a\":1}", "[DONE]"]);
    }
}
