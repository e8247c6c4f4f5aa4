//! `bench faults`: pod kill, restart, join, unique prompts and a soak, under load.

use super::{Args, Summary};
use crate::faults;
use prefix_core::model::ModelBundle;

/// Runs it; what it measured, for the summary.
pub fn run(a: &Args, _bundle: &ModelBundle) -> anyhow::Result<Summary> {
    let mut out = serde_json::Map::new();
    let p = faults::FaultParams {
        rate: a.fault_rate,
        pods: 3,
        unique_prompts: a
            .fault_unique
            .unwrap_or(if a.quick { 10_000 } else { 100_000 }),
        soak_s: a.soak_s.unwrap_or(if a.quick { 60 } else { 600 }),
        kill_every_s: a.kill_every_s.unwrap_or(if a.quick { 20 } else { 60 }),
        poll_interval_ms: prefix_core::router_config::DEFAULT_POLL_INTERVAL_MS,
    };
    println!("== faults: {} sim pods (+1 that joins) behind Envoy with the filter, members from EDS; {p:?}", p.pods);
    let r = faults::run(&p, &a.out)?;
    print!("{}", faults::table(&r));
    out.insert("faults".into(), serde_json::to_value(&r)?);
    Ok(out)
}
