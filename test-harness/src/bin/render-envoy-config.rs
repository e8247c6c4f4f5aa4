//! `render-envoy-config`: writes an Envoy config for a list of pods (nobody edits ports by hand).
//!
//! `render-envoy-config --pods 127.0.0.1:8001,127.0.0.1:8002 --listen-port 10000 > envoy.yaml`

use clap::Parser;
use std::path::PathBuf;
use test_harness::envoy_config::{render, EnvoySettings};
use test_harness::paths;

#[derive(Parser)]
#[command(version, about)]
struct Args {
    /// Pods as ip:port, comma-separated.
    #[arg(long, value_delimiter = ',', required = true)]
    pods: Vec<String>,
    #[arg(long, default_value_t = 10000)]
    listen_port: u16,
    #[arg(long, default_value_t = 9901)]
    admin_port: u16,
    /// The filter's .wasm (default: the release build).
    #[arg(long)]
    wasm: Option<PathBuf>,
    /// Render Envoy without the filter (plain round-robin).
    #[arg(long)]
    no_filter: bool,
    #[arg(long, default_value_t = 128)]
    block_size: u32,
    #[arg(long, default_value = "SmolLM2-135M-Instruct")]
    model_name: String,
    #[arg(long, default_value_t = 4 * 1024 * 1024)]
    max_body_bytes: usize,
    /// Add x-prefix-router-* debug response headers.
    #[arg(long)]
    debug_headers: bool,
    #[arg(long, default_value_t = 65_536)]
    table_capacity: u64,
    /// Routing policy: prefix, round_robin, random, least_loaded.
    #[arg(long, default_value = "prefix")]
    policy: String,
    /// How often the filter polls pods for health, load and cache events (0 = never).
    #[arg(long, default_value_t = 500)]
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
