//! The `bench` command line (run via `scripts/bench.sh`): which benchmark, its parameters, and
//! the summary it prints and writes. Prints tables and writes JSON/CSV/plots under `--out`.
//! Goals are reported as ratios, never asserted.
//!
//! - `policies` (default): prefix routing vs round_robin / random / least_loaded, and the peer
//!   routers (vllm-router, sglang-router), on four seeded workloads plus two closed-loop ones,
//!   N sim pods; `--quick` ≤ 2 minutes (without the peers).
//! - `cache`: cache cost per block, tokenizer throughput, server requests/s.
//! - `filter`: filter overhead, Envoy with vs without it.
//! - `faults`: pod kill / restart / join under load, unique prompts, a soak with kills.
//! - `hostile`: hostile requests through Envoy and at a pod, each timed, with a small
//!   request right after.

mod cache;
mod engine;
mod faults;
mod filter;
mod hostile;
mod policies;
mod vllm;

use crate::overhead::Prompts;
use crate::trace::Workload;
use crate::{micro, write_json};
use clap::{Parser, ValueEnum};
use std::path::PathBuf;

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Which {
    /// prefix routing against the other policies (workloads × policies)
    Policies,
    /// cache lookup+insert per block, tokenizer throughput, server requests/s
    Cache,
    /// filter overhead: Envoy with vs without the filter, 128 / 2k / 8k-token prompts
    Filter,
    /// the real engine: TTFT cold vs warm for 1–8 cached blocks, prefill/decode speed
    Engine,
    /// pod failures and churn under load: kill, restart, join, unique prompts, soak
    Faults,
    /// hostile requests (huge words, batches, deep JSON, …) through Envoy and at a pod:
    /// status and time of each, and of a small request right after
    Hostile,
    /// prefix routing on three real vLLM pods, with their KV-cache events and without, beside
    /// round robin and the peer routers (a short closed-loop run; not part of `all`)
    Vllm,
    /// everything
    All,
}

/// One load of the filter-overhead benchmark.
#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OverheadCase {
    /// 128-token prompts unique by a leading counter
    #[value(name = "unique-128")]
    Unique128,
    /// 2k-token prompts unique by a leading counter (the goals' case)
    #[value(name = "unique-2k")]
    Unique2k,
    /// 8k-token prompts unique by a leading counter
    #[value(name = "unique-8k")]
    Unique8k,
    /// the same 2k-token prompt every time
    #[value(name = "same-2k")]
    Same2k,
    /// 2k-token prompts of words shuffled per request
    #[value(name = "shuffled-2k")]
    Shuffled2k,
}

impl OverheadCase {
    const ALL: [OverheadCase; 5] = [
        OverheadCase::Unique128,
        OverheadCase::Unique2k,
        OverheadCase::Unique8k,
        OverheadCase::Same2k,
        OverheadCase::Shuffled2k,
    ];

    /// (prompt tokens, how requests differ)
    pub fn load(self) -> (usize, Prompts) {
        match self {
            OverheadCase::Unique128 => (128, Prompts::Counter),
            OverheadCase::Unique2k => (2048, Prompts::Counter),
            OverheadCase::Unique8k => (8000, Prompts::Counter),
            OverheadCase::Same2k => (2048, Prompts::Same),
            OverheadCase::Shuffled2k => (2048, Prompts::Shuffled),
        }
    }
}

#[derive(Parser)]
#[command(about)]
pub struct Args {
    #[arg(value_enum, default_value_t = Which::Policies)]
    which: Which,
    /// A short run (≤ 2 minutes on 2 cores).
    #[arg(long)]
    quick: bool,
    /// Sim pods behind Envoy.
    #[arg(long, default_value_t = 8)]
    pods: usize,
    /// Zero-cost sim pods behind both Envoys of the filter-overhead run (the filter reads every
    /// pod's load per request, so more pods cost it a little more).
    #[arg(long, default_value_t = 1)]
    overhead_pods: usize,
    /// Requests per workload × policy run (default 24 quick, 150 full).
    #[arg(long)]
    requests: Option<usize>,
    /// Also run the peer routers (vllm-router, sglang-router) in front of the same pods
    /// (default: yes, except with --quick).
    #[arg(long)]
    peers: Option<bool>,
    /// Also drive every front with inference-perf (default: yes, except with --quick).
    #[arg(long)]
    inference_perf: Option<bool>,
    /// Requests of each closed-loop shared-prefix run (default 64 quick, 1000 full).
    #[arg(long)]
    saturated_requests: Option<usize>,
    /// Offered load, requests per second (Poisson arrivals).
    #[arg(long, default_value_t = 8.0)]
    rate: f64,
    /// Tenants / conversations.
    #[arg(long, default_value_t = 4)]
    tenants: u32,
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// Only these fronts, by their names in the tables (`prefix`, `round_robin`,
    /// `sglang-router cache_aware`, …; default: all).
    #[arg(long, value_delimiter = ',')]
    fronts: Vec<String>,
    /// Only these open-loop workloads (default: all four; the closed-loop runs replay
    /// shared-prefix and are skipped when it is not among them).
    #[arg(long, value_enum, value_delimiter = ',')]
    workloads: Vec<Workload>,
    /// Only the runs of these workloads, by their names in the tables, open or closed loop or
    /// inference-perf (e.g. `long-prefix-saturated,ip-long-prefix`; default: all).
    #[arg(long, value_delimiter = ',')]
    only: Vec<String>,
    /// Runs of the whole comparison: the table shows each measure's median and range, and
    /// the goals read the medians (this machine is noisy; never conclude from one run).
    #[arg(long, default_value_t = 1)]
    repeat: usize,
    /// Only these filter-overhead loads (default: all five, then the tokenizer families;
    /// naming loads skips the families), e.g. `--overhead-cases unique-2k` to compare builds
    /// of the filter quickly with `PREFIX_ROUTER_WASM`.
    #[arg(long, value_enum, value_delimiter = ',')]
    overhead_cases: Vec<OverheadCase>,
    /// Seconds of load per wrk measurement (cache/filter benchmarks).
    #[arg(long, default_value_t = 10)]
    seconds: u32,
    /// Concurrent connections of wrk.
    #[arg(long, default_value_t = 8)]
    connections: u32,
    /// Blocks cached in the cache benchmark.
    #[arg(long, default_value_t = 1_000_000)]
    cache_blocks: usize,
    /// Faults: offered load, requests/s.
    #[arg(long, default_value_t = 50.0)]
    fault_rate: f64,
    /// Faults: unique prompts sent to check Envoy's memory (default 10k quick, 100k full).
    #[arg(long)]
    fault_unique: Option<usize>,
    /// Faults: soak length in seconds (default 60 quick, 600 full).
    #[arg(long)]
    soak_s: Option<u64>,
    /// Faults: a pod is killed every this many seconds of the soak (default 20 quick, 60 full).
    #[arg(long)]
    kill_every_s: Option<u64>,
    /// Output directory.
    #[arg(long, default_value = "bench-results/latest")]
    out: PathBuf,
}

/// A (p50, p99) pair as printed, `n/a` when there were no samples.
pub fn p50_p99(v: Option<(f64, f64)>) -> String {
    v.map(|(a, b)| format!("{a:.0} / {b:.0}"))
        .unwrap_or_else(|| "n/a".into())
}

/// Parses the command line and runs the chosen benchmarks.
pub fn main() -> anyhow::Result<()> {
    let a = Args::parse();
    std::fs::create_dir_all(&a.out)?;
    let bundle = micro::default_bundle()?;
    let mut summary = serde_json::Map::new();
    summary.insert(
        "machine".into(),
        serde_json::json!({
            "cores": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
            "note": "everything (load generator, Envoy, pods) shares this machine's cores",
        }),
    );
    let all = a.which == Which::All;
    // in the order they run; a full policies run ends with a short filter-overhead table
    let runs: [(bool, Runner); 7] = [
        (all || a.which == Which::Policies, policies::run),
        (all || a.which == Which::Cache, cache::run),
        (
            all || a.which == Which::Filter || (a.which == Which::Policies && !a.quick),
            filter::run,
        ),
        (all || a.which == Which::Hostile, hostile::run),
        (a.which == Which::Vllm, vllm::run),
        (a.which == Which::Faults, faults::run),
        (all || a.which == Which::Engine, engine::run),
    ];
    for (chosen, run) in runs {
        if chosen {
            summary.extend(run(&a, &bundle)?);
        }
    }
    write_json(&a.out, "results", &summary)?;
    println!("results written to {}", a.out.display());
    Ok(())
}

/// What a subcommand measured, as entries of the summary it writes.
type Summary = serde_json::Map<String, serde_json::Value>;

/// One subcommand.
type Runner = fn(&Args, &prefix_core::model::ModelBundle) -> anyhow::Result<Summary>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overhead_cases_are_named_on_the_command_line() {
        let a = Args::try_parse_from(["bench", "filter", "--overhead-cases", "unique-2k,same-2k"])
            .unwrap();
        let loads: Vec<_> = a.overhead_cases.iter().map(|c| c.load()).collect();
        assert_eq!(loads, [(2048, Prompts::Counter), (2048, Prompts::Same)]);
        let all = Args::try_parse_from(["bench", "filter"]).unwrap();
        assert!(
            all.overhead_cases.is_empty(),
            "none named: all five, and the families"
        );
        assert!(Args::try_parse_from(["bench", "--overhead-cases", "unique-3k"]).is_err());
    }
}
