//! `render-envoy-config`: writes an Envoy config for a list of pods (nobody edits ports by hand).
//!
//! `render-envoy-config --pods 127.0.0.1:8001,127.0.0.1:8002 --listen-port 10000 > envoy.yaml`

use clap::Parser;
use prefix_core::protocol::defaults;
use prefix_core::router_config::{DEFAULT_POLL_INTERVAL_MS, DEFAULT_TABLE_CAPACITY};
use std::path::PathBuf;
use test_harness::envoy_config::{render, EnvoySettings};
use test_harness::paths;

#[derive(Parser)]
#[command(
    version,
    about = "Writes the Envoy configuration for prefix-router in front of a list of pods: the \
             listener, the header scrubbing, the wasm filter with its plugin configuration \
             (validated exactly as the filter will), and the pod clusters."
)]
struct Args {
    /// Pods as ip:port, comma-separated.
    #[arg(long, value_delimiter = ',', required = true)]
    pods: Vec<String>,
    /// Port of the inference listener (on 127.0.0.1).
    #[arg(long, default_value_t = 10000)]
    listen_port: u16,
    /// Port of Envoy's admin interface (on 127.0.0.1; /stats/prometheus has the filter's metrics).
    #[arg(long, default_value_t = 9901)]
    admin_port: u16,
    /// The filter's .wasm (default: the release build).
    #[arg(long)]
    wasm: Option<PathBuf>,
    /// Render Envoy without the filter (plain round-robin).
    #[arg(long)]
    no_filter: bool,
    /// Prefix-cache block size in tokens (must equal the pods').
    #[arg(long, default_value_t = defaults::BLOCK_SIZE)]
    block_size: u32,
    /// Served model name (seeds the block hashes, as the pods' --served-model-name).
    #[arg(long, default_value = defaults::MODEL_NAME)]
    model_name: String,
    /// Largest request body the filter buffers (413 beyond).
    #[arg(long, default_value_t = defaults::MAX_BODY_BYTES)]
    max_body_bytes: usize,
    /// Add x-prefix-router-* debug response headers.
    #[arg(long)]
    debug_headers: bool,
    /// Entries of the filter's ownership table.
    #[arg(long, default_value_t = DEFAULT_TABLE_CAPACITY)]
    table_capacity: u64,
    /// Routing policy: prefix, round_robin, random, least_loaded.
    #[arg(long, default_value = "prefix")]
    policy: String,
    /// How often the filter polls pods for health, load and cache events (0 = never).
    #[arg(long, default_value_t = DEFAULT_POLL_INTERVAL_MS)]
    poll_interval_ms: u64,
    /// Write here instead of stdout.
    #[arg(long, short)]
    out: Option<PathBuf>,
}

fn main() -> anyhow::Result<()> {
    let a = Args::parse();
    let wasm = (!a.no_filter).then(|| a.wasm.clone().unwrap_or_else(paths::wasm_path));
    let mut s = EnvoySettings::new(a.listen_port, a.admin_port, a.pods, wasm);
    s.block_size = a.block_size;
    s.model_name = a.model_name;
    s.max_body_bytes = a.max_body_bytes;
    s.debug_headers = a.debug_headers;
    s.table_capacity = a.table_capacity;
    s.policy = a.policy;
    s.poll_interval_ms = a.poll_interval_ms;
    let yaml = render(&s, &paths::envoy_template_dir())?;
    match a.out {
        Some(p) => std::fs::write(p, yaml)?,
        None => print!("{yaml}"),
    }
    Ok(())
}
