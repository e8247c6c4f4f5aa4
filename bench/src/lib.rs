//! prefix-router's benchmark (`scripts/bench.sh`): numbers printed and written to files as
//! ratios measured side by side in one run, never asserted in tests. All load goes to
//! 127.0.0.1 and every run is bounded.
//!
//! # Layout
//!
//! In the order a policy run goes:
//!
//! - [`trace`]: seeded workloads (shared prefix, multi-turn, all-unique, hot tenant).
//! - [`oracle`]: the best hit rate a trace allows (one unbounded cache).
//! - [`policies`]: a fresh fleet per policy; [`replay`] sends the trace (open or closed loop).
//! - [`report`] and [`plots`]: tables, CSV/JSON, TTFT CDF charts.
//! - [`reasons`]: the filter's per-request reasons and their TTFTs, to explain a tail.
//! - [`repeats`]: medians and ranges over `--repeat` runs, which the goals read.
//! - [`overhead`] (with [`wrk`]): the same Envoy with and without the filter, beside the floor
//!   filter (`bench/floor-filter`), sglang-router and a direct call; CPU per request.
//! - [`micro`]: prefix cache, tokenizer, server; [`engine`]: the real engine's TTFT, speed
//!   and batching, beside [`llama_cpp`] on the same model and cores.
//! - [`faults`]: pod kill, restart, join, unique prompts and a soak, under load.
//! - [`hostile`]: hostile requests through Envoy and at a pod, timed.
//! - [`vllm_fleet`]: the policies and the peers on real vLLM pods, events on and off.
//! - [`cli`]: the `bench` command line, one file per subcommand, that runs them and prints
//!   and writes the summary.

pub mod cli;
pub mod engine;
pub mod faults;
pub mod hostile;
pub mod inference_perf;
pub mod llama_cpp;
pub mod micro;
pub mod oracle;
pub mod overhead;
pub mod peers;
pub mod plots;
pub mod policies;
pub mod reasons;
pub mod repeats;
pub mod replay;
pub mod report;
pub mod trace;
pub mod vllm_fleet;
pub mod wrk;

use serde::Serialize;
use std::path::Path;
use test_harness::cluster::{run_dir, start_pods};
use test_harness::fleet::ZERO_COST;

/// Writes `value` as pretty JSON to `dir/name.json`.
/// POSTs `body` as JSON and returns the JSON answer; an HTTP error status is an error.
pub fn post_json(
    http: &reqwest::blocking::Client,
    url: &str,
    body: &serde_json::Value,
) -> anyhow::Result<serde_json::Value> {
    Ok(http
        .post(url)
        .json(body)
        .send()?
        .error_for_status()?
        .json()?)
}

pub fn write_json<T: Serialize>(dir: &Path, name: &str, value: &T) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir)?;
    std::fs::write(
        dir.join(format!("{name}.json")),
        serde_json::to_vec_pretty(value)?,
    )?;
    Ok(())
}

/// Requests/s of one zero-cost sim pod, straight (no Envoy), for a prompt of `text`.
pub fn server(text: &str, seconds: u32, connections: u32) -> anyhow::Result<wrk::LoadResult> {
    let dir = run_dir("bench-server");
    let pods = start_pods(
        1,
        &[
            &ZERO_COST[..],
            &["--max-num-seqs", "64", "--default-max-tokens", "1"],
        ]
        .concat(),
        &dir,
    )?;
    let url = format!("http://{}/v1/completions", pods[0].addr);
    let body = format!("'{{\"prompt\":\"' .. n .. ' {text}\",\"max_tokens\":1}}'");
    wrk::run(&url, &body, connections, seconds, &dir)
}
