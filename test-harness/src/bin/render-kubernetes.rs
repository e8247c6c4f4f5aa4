//! `render-kubernetes`: rewrites the generated files of `deploy/kubernetes` (the fleets' Envoy
//! configurations, the Prometheus rules and the Grafana dashboard as ConfigMaps) from their
//! sources. `--check` only reports stale files (exit 1), as the test suite does.

use clap::Parser;
use test_harness::kubernetes::generated;
use test_harness::paths;

#[derive(Parser)]
#[command(
    version,
    about = "Rewrites the generated ConfigMaps of deploy/kubernetes."
)]
struct Args {
    /// Report stale files instead of writing them.
    #[arg(long)]
    check: bool,
}

fn main() -> anyhow::Result<()> {
    let a = Args::parse();
    let root = paths::repo_root();
    let mut stale = Vec::new();
    for (rel, content) in generated()? {
        let path = root.join(&rel);
        if std::fs::read_to_string(&path).ok().as_deref() == Some(content.as_str()) {
            continue;
        }
        if a.check {
            stale.push(rel.display().to_string());
        } else {
            std::fs::write(&path, content)?;
            println!("wrote {}", rel.display());
        }
    }
    if !stale.is_empty() {
        anyhow::bail!("stale (run render-kubernetes): {}", stale.join(", "));
    }
    Ok(())
}
