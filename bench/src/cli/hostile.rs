//! `bench hostile`: hostile requests through Envoy and at a pod, each timed.

use super::{Args, Summary};
use prefix_core::model::ModelBundle;

/// Runs it; what it measured, for the summary.
pub fn run(_a: &Args, _bundle: &ModelBundle) -> anyhow::Result<Summary> {
    let mut out = serde_json::Map::new();
    println!("== hostile requests through Envoy + filter and at a pod (2 zero-cost sim pods)");
    let rows = crate::hostile::run()?;
    print!("{}", crate::hostile::table(&rows));
    out.insert("hostile".into(), serde_json::to_value(&rows)?);
    Ok(out)
}
