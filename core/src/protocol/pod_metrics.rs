//! Load and restarts of pods that are not this project's server (vLLM, SGLang, llama.cpp),
//! read from their Prometheus `/metrics` with the names of the Gateway API Inference
//! Extension's model-server protocol.
//!
//! Such pods have no cache-events endpoint: the router learns their load (running and
//! waiting requests, KV-cache usage) and notices a restart (the process start time changes,
//! or a monotonic counter goes backwards) from their metrics, and keeps its own records of
//! which blocks it sent where.
//!
//! Only a handful of series are wanted from a text that can be large, and this runs inside
//! the wasm filter: a line scanner reads just those. (Two parser crates were tried for the
//! test harness: `prometheus-parse` rejects the `:` in these very names, and
//! `prom_text_format_parser` returns nothing at all on the first line it dislikes; neither
//! suits a router that must keep working on whatever a pod serves.)

use super::LoadReport;
use crate::pod_costs::WorkCounters;

/// The series each kind of server reports a value under; the first present wins.
struct Names {
    running: &'static [&'static str],
    waiting: &'static [&'static str],
    kv_usage: &'static [&'static str],
    /// A counter that only grows while the process lives: prompt tokens.
    monotonic: &'static [&'static str],
    /// Prompt tokens found in the prefix cache (counter).
    cached_tokens: &'static [&'static str],
    /// Requests prefilled and their prefill seconds (queue excluded).
    prefills: &'static [&'static str],
    prefill_seconds: &'static [&'static str],
    /// Requests finished and the seconds they held a slot.
    finished: &'static [&'static str],
    slot_seconds: &'static [&'static str],
}

const NAMES: Names = Names {
    running: &[
        "vllm:num_requests_running",
        "sglang:num_running_reqs",
        "llamacpp:requests_processing",
    ],
    waiting: &[
        "vllm:num_requests_waiting",
        "sglang:num_queue_reqs",
        "llamacpp:requests_deferred",
    ],
    kv_usage: &[
        "vllm:kv_cache_usage_perc",
        "vllm:gpu_cache_usage_perc",
        "sglang:token_usage",
        "llamacpp:kv_cache_usage_ratio",
    ],
    monotonic: &[
        "vllm:prompt_tokens_total",
        "sglang:prompt_tokens_total",
        "llamacpp:prompt_tokens_total",
    ],
    cached_tokens: &["vllm:prefix_cache_hits_total", "sglang:cached_tokens_total"],
    prefills: &["vllm:request_prefill_time_seconds_count"],
    // llama.cpp counts only the prompt tokens it evaluated, and their seconds
    prefill_seconds: &[
        "vllm:request_prefill_time_seconds_sum",
        "llamacpp:prompt_seconds_total",
    ],
    // SGLang has no slot-time histogram: its end-to-end latency (queue included) stands in
    finished: &[
        "vllm:request_inference_time_seconds_count",
        "sglang:e2e_request_latency_seconds_count",
    ],
    slot_seconds: &[
        "vllm:request_inference_time_seconds_sum",
        "sglang:e2e_request_latency_seconds_sum",
    ],
};

/// The process start time series (Prometheus client libraries' process collector).
const START_TIME: &str = "process_start_time_seconds";

/// What a pod's `/metrics` says.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct MetricsReport {
    pub load: LoadReport,
    /// `process_start_time_seconds`, when exposed.
    pub start_time: Option<f64>,
    /// A counter that only grows while the process lives (prompt tokens), when exposed.
    pub monotonic: Option<f64>,
}

/// vLLM's cache configuration, as labels of a constant gauge: the prefix cache's size is
/// `num_gpu_blocks × block_size` tokens.
const CACHE_CONFIG: &str = "vllm:cache_config_info";

/// The name, label set (without braces) and value of one sample line
/// `name{labels} value [timestamp]`.
fn sample(line: &str) -> Option<(&str, &str, f64)> {
    let line = line.trim_start();
    if line.starts_with('#') || line.is_empty() {
        return None;
    }
    let name_end = line
        .find(|c: char| c == '{' || c.is_ascii_whitespace())
        .unwrap_or(line.len());
    let (name, mut rest) = line.split_at(name_end);
    let mut labels = "";
    if let Some(set) = rest.strip_prefix('{') {
        // the label set ends at the first `}` outside a quoted value
        let mut at = 0;
        let end = loop {
            let i = at + set.get(at..)?.find(['"', '}'])?;
            if set[i..].starts_with('}') {
                break i;
            }
            at = i + 1 + closing_quote(&set[i + 1..])? + 1;
        };
        labels = &set[..end];
        rest = &set[end + 1..];
    }
    let value = rest.split_ascii_whitespace().next()?;
    let value = match value {
        "+Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        v => v.parse().ok()?,
    };
    Some((name, labels, value))
}

/// Where the quoted value `s` is inside of (just after its opening quote) ends: the index of
/// the first quote not escaped by a backslash.
fn closing_quote(s: &str) -> Option<usize> {
    let mut escaped = false;
    for (i, c) in s.char_indices() {
        match c {
            _ if escaped => escaped = false,
            '\\' => escaped = true,
            '"' => return Some(i),
            _ => {}
        }
    }
    None
}

/// The value of label `key` in a label set `a="1",b="x"` (values with escapes are not
/// unescaped: only plain ones are wanted here).
fn label<'a>(labels: &'a str, key: &str) -> Option<&'a str> {
    let mut rest = labels;
    loop {
        let (k, tail) = rest.split_once('=')?;
        let tail = tail.strip_prefix('"')?;
        let end = closing_quote(tail)?;
        if k.trim() == key {
            return Some(&tail[..end]);
        }
        rest = tail[end + 1..].trim_start_matches(',');
    }
}

/// Prefix-cache capacity in tokens from vLLM's cache-configuration labels.
fn cache_tokens(labels: &str) -> Option<f64> {
    let n = |k| {
        label(labels, k)?
            .parse::<f64>()
            .ok()
            .filter(|v| v.is_finite() && *v > 0.0)
    };
    Some(n("num_gpu_blocks")? * n("block_size")?)
}

/// Reads the load, start time and a monotonic counter from a Prometheus text exposition.
/// Values of a series with several label sets (e.g. one per served model) are summed; the
/// KV-cache usage is their maximum. `None` when none of the load series is present (not a
/// model server this router understands).
pub fn read_metrics(text: &str) -> Option<MetricsReport> {
    // per wanted name: (sum, max, seen)
    let wanted: Vec<&str> = [
        NAMES.running,
        NAMES.waiting,
        NAMES.kv_usage,
        NAMES.monotonic,
        NAMES.cached_tokens,
        NAMES.prefills,
        NAMES.prefill_seconds,
        NAMES.finished,
        NAMES.slot_seconds,
    ]
    .concat()
    .into_iter()
    .chain([START_TIME])
    .collect();
    let mut found: Vec<Option<(f64, f64)>> = vec![None; wanted.len()];
    let mut cache = None;
    for line in text.lines() {
        let Some((name, labels, value)) = sample(line) else {
            continue;
        };
        if name == CACHE_CONFIG {
            cache = cache.or(cache_tokens(labels));
            continue;
        }
        if let Some(i) = wanted.iter().position(|w| *w == name) {
            if let Some(slot) = found.get_mut(i) {
                let (sum, max) = slot.unwrap_or((0.0, f64::MIN));
                *slot = Some((sum + value, max.max(value)));
            }
        }
    }
    let first = |names: &[&str], pick: fn((f64, f64)) -> f64| -> Option<f64> {
        names.iter().find_map(|n| {
            let i = wanted.iter().position(|w| w == n)?;
            found.get(i).copied().flatten().map(pick)
        })
    };
    let sum = |(s, _): (f64, f64)| s;
    let max = |(_, m): (f64, f64)| m;
    let running = first(NAMES.running, sum);
    let waiting = first(NAMES.waiting, sum);
    let kv = first(NAMES.kv_usage, max);
    if running.is_none() && waiting.is_none() && kv.is_none() {
        return None;
    }
    let count = |v: Option<f64>| v.map_or(0, |v| v.clamp(0.0, f64::from(u32::MAX)) as u32);
    let prompt = first(NAMES.monotonic, sum);
    let work = WorkCounters {
        prefills: first(NAMES.prefills, sum),
        prefill_seconds: first(NAMES.prefill_seconds, sum),
        computed_tokens: prompt
            .map(|p| (p - first(NAMES.cached_tokens, sum).unwrap_or(0.0)).max(0.0)),
        finished: first(NAMES.finished, sum),
        slot_seconds: first(NAMES.slot_seconds, sum),
        max_num_seqs: None,
        cache_tokens: cache,
    };
    Some(MetricsReport {
        load: LoadReport {
            running: count(running),
            waiting: count(waiting),
            kv_cache_usage: kv.unwrap_or(0.0).clamp(0.0, 1.0),
            work,
        },
        start_time: first(&[START_TIME], max),
        monotonic: prompt,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const VLLM: &str = r#"# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="meta-llama/Llama-3.2-1B"} 3.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="meta-llama/Llama-3.2-1B"} 2.0
vllm:kv_cache_usage_perc{engine="0",model_name="meta-llama/Llama-3.2-1B"} 0.42
vllm:prompt_tokens_total{engine="0",model_name="meta-llama/Llama-3.2-1B"} 12345.0
vllm:time_to_first_token_seconds_bucket{le="+Inf",model_name="m"} 7.0
vllm:prefix_cache_hits_total{engine="0",model_name="meta-llama/Llama-3.2-1B"} 2345.0
vllm:request_prefill_time_seconds_sum{engine="0",model_name="meta-llama/Llama-3.2-1B"} 1.5
vllm:request_prefill_time_seconds_count{engine="0",model_name="meta-llama/Llama-3.2-1B"} 7.0
vllm:request_inference_time_seconds_sum{engine="0",model_name="meta-llama/Llama-3.2-1B"} 3.5
vllm:request_inference_time_seconds_count{engine="0",model_name="meta-llama/Llama-3.2-1B"} 6.0
process_start_time_seconds 1.7e+09
"#;

    #[test]
    fn reads_the_work_counters_costs_are_learned_from() {
        let w = read_metrics(VLLM).map(|r| r.load.work).unwrap_or_default();
        assert_eq!(w.prefills, Some(7.0));
        assert_eq!(w.prefill_seconds, Some(1.5));
        assert_eq!(
            w.computed_tokens,
            Some(10000.0),
            "prompt tokens minus cache hits"
        );
        assert_eq!((w.finished, w.slot_seconds), (Some(6.0), Some(3.5)));
        let llama = "llamacpp:requests_processing 1\nllamacpp:prompt_tokens_total 640\nllamacpp:prompt_seconds_total 2.5\n";
        let w = read_metrics(llama).map(|r| r.load.work).unwrap_or_default();
        assert_eq!(
            (w.computed_tokens, w.prefill_seconds),
            (Some(640.0), Some(2.5))
        );
        assert_eq!((w.prefills, w.finished), (None, None));
        assert_eq!(w.cache_tokens, None, "llama.cpp does not say");
    }

    #[test]
    fn reads_the_prefix_cache_size_from_vllms_cache_config_labels() {
        let text = "vllm:num_requests_running 0\n# HELP vllm:cache_config_info Information of the LLMCacheConfig.\nvllm:cache_config_info{block_size=\"16\",cache_dtype=\"auto\",note=\"a \\\"quoted\\\", b=1\",num_gpu_blocks=\"27153\",enable_prefix_caching=\"True\"} 1.0\n";
        let w = read_metrics(text).map(|r| r.load.work).unwrap_or_default();
        assert_eq!(w.cache_tokens, Some(16.0 * 27153.0));
        for bad in [
            "vllm:cache_config_info{block_size=\"16\"} 1",
            "vllm:cache_config_info{block_size=\"16\",num_gpu_blocks=\"None\"} 1",
            "vllm:cache_config_info{block_size=\"0\",num_gpu_blocks=\"9\"} 1",
        ] {
            let text = format!("vllm:num_requests_running 0\n{bad}\n");
            let w = read_metrics(&text).map(|r| r.load.work).unwrap_or_default();
            assert_eq!(w.cache_tokens, None, "{bad}");
        }
    }

    #[test]
    fn reads_each_kind_of_server() {
        // (what, text, running, waiting, kv usage, start time, monotonic)
        let cases = [
            ("vllm", VLLM, 3, 2, 0.42, Some(1.7e9), Some(12345.0)),
            (
                "vllm, older kv name, two models",
                "vllm:num_requests_running{model_name=\"a\"} 1\nvllm:num_requests_running{model_name=\"b\"} 2\nvllm:gpu_cache_usage_perc{model_name=\"a\"} 0.1\nvllm:gpu_cache_usage_perc{model_name=\"b\"} 0.3\n",
                3, 0, 0.3, None, None,
            ),
            (
                "sglang",
                "sglang:num_running_reqs{model_name=\"q\"} 4\nsglang:num_queue_reqs{model_name=\"q\"} 5\nsglang:token_usage{model_name=\"q\"} 0.25\nsglang:prompt_tokens_total{model_name=\"q\"} 99\n",
                4, 5, 0.25, None, Some(99.0),
            ),
            (
                "llama.cpp",
                "# HELP llamacpp:requests_processing Number of requests processing.\n# TYPE llamacpp:requests_processing gauge\nllamacpp:requests_processing 1\nllamacpp:requests_deferred 6\nllamacpp:kv_cache_usage_ratio 0.5\nllamacpp:prompt_tokens_total 640\n",
                1, 6, 0.5, None, Some(640.0),
            ),
        ];
        for (what, text, running, waiting, kv, start, mono) in cases {
            let r = read_metrics(text).unwrap_or_else(|| panic!("{what}"));
            assert_eq!(
                (r.load.running, r.load.waiting),
                (running, waiting),
                "{what}"
            );
            assert!((r.load.kv_cache_usage - kv).abs() < 1e-9, "{what}");
            assert_eq!(r.start_time, start, "{what}");
            assert_eq!(r.monotonic, mono, "{what}");
        }
    }

    #[test]
    fn odd_lines_are_skipped_not_fatal() {
        let text = "garbage line without value\nvllm:num_requests_running{model_name=\"has } brace and \\\" quote\"} 2 1700000000000\nvllm:num_requests_waiting{bad=\"unterminated} 9\nvllm:num_requests_waiting NaNx\n\n  # indented comment\nvllm:kv_cache_usage_perc 7\n";
        let r = read_metrics(text).unwrap();
        assert_eq!(
            r.load.running, 2,
            "labels may hold braces and escaped quotes"
        );
        assert_eq!(r.load.waiting, 0, "unparseable samples are ignored");
        assert_eq!(r.load.kv_cache_usage, 1.0, "usage is clamped to 0..1");
        assert_eq!(
            read_metrics("# nothing here\nfoo 1\n"),
            None,
            "not a model server"
        );
        assert_eq!(read_metrics(""), None);
    }
}
