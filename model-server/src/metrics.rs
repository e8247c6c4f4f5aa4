//! Prometheus metrics under vLLM's names, so existing queries and dashboards work unchanged.
//!
//! Every series carries `model_name` (as vLLM) and `pod` (this server's pod name), so
//! `sum by (pod) (vllm:prefix_cache_hits_total)` shows which pod reuses work. Prefix-cache
//! counters are in tokens, as vLLM counts them.

use prometheus::{
    Encoder, Gauge, Histogram, HistogramOpts, IntCounter, IntGauge, Opts, Registry, TextEncoder,
};

pub struct Metrics {
    registry: Registry,
    pub prefix_cache_queries: IntCounter,
    pub prefix_cache_hits: IntCounter,
    pub running: IntGauge,
    pub waiting: IntGauge,
    pub kv_cache_usage: Gauge,
    pub prompt_tokens: IntCounter,
    pub generation_tokens: IntCounter,
    pub ttft: Histogram,
    pub e2e: Histogram,
    /// vLLM's request phases: waiting for a slot; from the slot to the first token; from the
    /// slot to the end (the time the request held it).
    pub queue_time: Histogram,
    pub prefill_time: Histogram,
    pub inference_time: Histogram,
    /// Tokens computed per engine step (prompt and output), as vLLM's: how much batching the
    /// real engine does. The sim engine has no steps and leaves it empty.
    pub iteration_tokens: Histogram,
    pub blocks_stored: IntCounter,
    pub blocks_evicted: IntCounter,
    pub requests_rejected: IntCounter,
}

/// vLLM's buckets for tokens per engine step.
const ITERATION_TOKEN_BUCKETS: &[f64] = &[
    1.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0, 8192.0, 16384.0,
];

const LATENCY_BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0,
];

impl Metrics {
    pub fn new(
        model_name: &str,
        pod: &str,
        block_size: u32,
        num_blocks: usize,
    ) -> prometheus::Result<Self> {
        let registry = Registry::new();
        let opts = |name: &str, help: &str| {
            Opts::new(name, help)
                .const_label("model_name", model_name)
                .const_label("pod", pod)
        };
        let counter = |name: &str, help: &str| -> prometheus::Result<IntCounter> {
            let c = IntCounter::with_opts(opts(name, help))?;
            registry.register(Box::new(c.clone()))?;
            Ok(c)
        };
        let int_gauge = |name: &str, help: &str| -> prometheus::Result<IntGauge> {
            let g = IntGauge::with_opts(opts(name, help))?;
            registry.register(Box::new(g.clone()))?;
            Ok(g)
        };
        let histogram_in = |name: &str, help: &str, buckets: &[f64]| {
            let o = opts(name, help);
            let h = Histogram::with_opts(HistogramOpts::from(o).buckets(buckets.to_vec()))?;
            registry.register(Box::new(h.clone()))?;
            prometheus::Result::Ok(h)
        };
        let histogram = |name: &str, help: &str| histogram_in(name, help, LATENCY_BUCKETS);

        let kv_cache_usage = Gauge::with_opts(opts(
            "vllm:kv_cache_usage_perc",
            "Fraction of prefix-cache blocks in use (1 = full).",
        ))?;
        registry.register(Box::new(kv_cache_usage.clone()))?;
        let info = Gauge::with_opts(
            opts(
                "vllm:cache_config_info",
                "Information of the prefix-cache configuration.",
            )
            .const_label("block_size", block_size.to_string())
            .const_label("num_gpu_blocks", num_blocks.to_string()),
        )?;
        info.set(1.0);
        registry.register(Box::new(info))?;

        Ok(Metrics {
            prefix_cache_queries: counter(
                "vllm:prefix_cache_queries_total",
                "Prompt tokens looked up in the prefix cache.",
            )?,
            prefix_cache_hits: counter(
                "vllm:prefix_cache_hits_total",
                "Prompt tokens found in the prefix cache (prefill skipped).",
            )?,
            running: int_gauge("vllm:num_requests_running", "Requests being computed.")?,
            waiting: int_gauge("vllm:num_requests_waiting", "Requests waiting for a slot.")?,
            kv_cache_usage,
            prompt_tokens: counter("vllm:prompt_tokens_total", "Prompt tokens processed.")?,
            generation_tokens: counter("vllm:generation_tokens_total", "Tokens generated.")?,
            ttft: histogram("vllm:time_to_first_token_seconds", "Time to first token.")?,
            e2e: histogram(
                "vllm:e2e_request_latency_seconds",
                "End-to-end request latency.",
            )?,
            queue_time: histogram(
                "vllm:request_queue_time_seconds",
                "Time requests spent waiting for a running slot.",
            )?,
            prefill_time: histogram(
                "vllm:request_prefill_time_seconds",
                "Time from getting a running slot to the first token.",
            )?,
            inference_time: histogram(
                "vllm:request_inference_time_seconds",
                "Time requests held a running slot (prefill and decode).",
            )?,
            iteration_tokens: histogram_in(
                "vllm:iteration_tokens_total",
                "Histogram of number of tokens per engine_step.",
                ITERATION_TOKEN_BUCKETS,
            )?,
            blocks_stored: counter(
                "prefix_router:cache_blocks_stored_total",
                "Blocks inserted into the prefix cache.",
            )?,
            blocks_evicted: counter(
                "prefix_router:cache_blocks_evicted_total",
                "Blocks evicted from the prefix cache (LRU).",
            )?,
            requests_rejected: counter(
                "prefix_router:requests_rejected_total",
                "Requests answered with an error before inference.",
            )?,
            registry,
        })
    }

    /// The cumulative counters routers learn this pod's costs from (the events page's
    /// `load.work`): the same numbers as the series above.
    pub fn work(
        &self,
        max_num_seqs: usize,
        cache_tokens: usize,
    ) -> prefix_core::pod_costs::WorkCounters {
        let prompt = self.prompt_tokens.get() as f64;
        let hits = self.prefix_cache_hits.get() as f64;
        prefix_core::pod_costs::WorkCounters {
            prefills: Some(self.prefill_time.get_sample_count() as f64),
            prefill_seconds: Some(self.prefill_time.get_sample_sum()),
            computed_tokens: Some((prompt - hits).max(0.0)),
            finished: Some(self.inference_time.get_sample_count() as f64),
            slot_seconds: Some(self.inference_time.get_sample_sum()),
            max_num_seqs: u32::try_from(max_num_seqs).ok(),
            cache_tokens: Some(cache_tokens as f64),
        }
    }

    /// The text exposition format.
    pub fn render(&self) -> String {
        let mut buf = Vec::new();
        let enc = TextEncoder::new();
        if enc.encode(&self.registry.gather(), &mut buf).is_err() {
            return String::new();
        }
        String::from_utf8(buf).unwrap_or_default()
    }
}
