//! `bench vllm`: the fronts on three real vLLM pods, with their events and without.

use super::{Args, Summary};
use prefix_core::model::ModelBundle;

/// Runs it; what it measured, for the summary.
pub fn run(a: &Args, _bundle: &ModelBundle) -> anyhow::Result<Summary> {
    let mut out = serde_json::Map::new();
    let requests = a
        .saturated_requests
        .unwrap_or(if a.quick { 48 } else { 192 });
    println!(
        "== real vLLM pods (3, CPU build, {}-block caches) with kv-events sidecars: {requests} shared-prefix requests, 6 clients, per front",
        crate::vllm_fleet::CACHE_BLOCKS
    );
    let dir = test_harness::cluster::run_dir("bench-vllm");
    let rows = crate::vllm_fleet::run(requests, 6, &dir)?;
    out.insert("vllm".into(), serde_json::to_value(&rows)?);
    Ok(out)
}
