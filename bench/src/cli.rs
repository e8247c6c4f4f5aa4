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

use crate::inference_perf::{self, IpWorkload};
use crate::overhead::Prompts;
use crate::peers::{Front, FRONTS};
use crate::policies::{
    run_all, Saturation, SimCosts, HOT_SATURATED, IP_HOT_GROUPS, IP_MANY_GROUPS, SATURATED,
};
use crate::trace::{TraceParams, Workload};
use crate::{engine, faults, micro, overhead, plots, report, server, write_json};
use clap::{Parser, ValueEnum};
use std::collections::btree_map::Entry;
use std::path::PathBuf;

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Which {
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
enum OverheadCase {
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
    fn load(self) -> (usize, Prompts) {
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
struct Args {
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
    /// Only these fronts, by their names in the tables (`prefix`, `cost`, `round_robin`,
    /// `sglang-router cache_aware`, …; default: all).
    #[arg(long, value_delimiter = ',')]
    fronts: Vec<String>,
    /// Only these workloads (default: all four).
    #[arg(long, value_enum, value_delimiter = ',')]
    workloads: Vec<Workload>,
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
fn p50_p99(v: Option<(f64, f64)>) -> String {
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

    if matches!(a.which, Which::Policies | Which::All) {
        let costs = SimCosts {
            ttft_base_ms: 5.0,
            prefill_us_per_token: 100.0,
            decode_ms_per_token: 4.0,
            max_num_seqs: 4,
        };
        let params = TraceParams {
            seed: a.seed,
            requests: a.requests.unwrap_or(if a.quick { 24 } else { 150 }),
            rate: a.rate,
            tenants: a.tenants,
            // ≈ 1.2 tokens per word: 2k–6k-token shared contexts
            context_words: (1700, 5000),
            max_tokens: 16,
        };
        let workloads = if a.workloads.is_empty() {
            Workload::ALL.to_vec()
        } else {
            a.workloads.clone()
        };
        // closed loop: as many clients as the fleet has sequence slots; 16 tenants with
        // 2k–6k-token contexts against 256-block (32k-token) pod caches, about 8 contexts each;
        // then 4 tenants, which every pod's cache holds
        let sat_requests = a
            .saturated_requests
            .unwrap_or(if a.quick { 64 } else { 1000 });
        let saturations = [(SATURATED, 16), (HOT_SATURATED, 4)].map(|(name, tenants)| Saturation {
            name,
            concurrency: a.pods * costs.max_num_seqs,
            tenants,
            requests: sat_requests,
            cache_blocks: 256,
        });
        // the same two situations generated and sent by inference-perf: 32 groups of 2k-token
        // system prompts (more than one pod's cache holds), and 4 groups (every pod's holds)
        let external: Vec<IpWorkload> =
            if a.inference_perf.unwrap_or(!a.quick) && inference_perf::installed() {
                [(IP_MANY_GROUPS, 32), (IP_HOT_GROUPS, 4)]
                    .map(|(name, groups)| IpWorkload {
                        name,
                        groups,
                        system_prompt_len: 2048,
                        question_len: 64,
                        output_len: 16,
                        requests: sat_requests,
                        concurrency: a.pods * costs.max_num_seqs,
                        cache_blocks: 256,
                    })
                    .to_vec()
            } else {
                if a.inference_perf == Some(true) {
                    println!(
                    "   (skipping inference-perf: not installed at {}; scripts/install-peers.sh)",
                    inference_perf::bin().display()
                );
                }
                Vec::new()
            };
        let with_peers = a.peers.unwrap_or(!a.quick);
        let fronts: Vec<Front> = FRONTS
            .iter()
            .copied()
            .filter(|f| a.fronts.is_empty() || a.fronts.iter().any(|n| n == f.name()))
            .filter(|f| match f {
                Front::Envoy(_) => true,
                Front::Peer(p, _) => {
                    if with_peers && !p.installed() {
                        println!(
                            "   (skipping {}: not installed at {}; scripts/install-peers.sh)",
                            f.name(),
                            p.bin().display()
                        );
                    }
                    with_peers && p.installed()
                }
            })
            .collect();
        println!("== policies: {} sim pods, sim costs {costs:?}", a.pods);
        println!("   open loop at the trace's arrival times; shared-prefix also closed loop: {saturations:?}");
        println!("   inference-perf (external load generator, its own shared-prefix prompts): {external:?}");
        println!(
            "   trace: {params:?}; workloads {:?}; fronts {:?}",
            workloads.iter().map(|w| w.name()).collect::<Vec<_>>(),
            fronts.iter().map(|f| f.name()).collect::<Vec<_>>()
        );
        let runs = run_all(
            &bundle,
            &workloads,
            &fronts,
            &params,
            a.pods,
            &costs,
            &saturations,
            &external,
            &a.out,
        )?;
        print!("{}", report::table(&runs));
        let goals = report::goals(&runs) + &report::peer_goals(&runs);
        print!("{goals}");
        report::write_csv(&runs, &a.out.join("results.csv"))?;
        let files = plots::write_all(&runs, &a.out)?;
        println!("   plots: {}", files.join(", "));
        summary.insert("policies".into(), serde_json::json!({"sim_costs": costs, "trace": params, "pods": a.pods, "runs": runs, "goals": goals}));
    }
    if matches!(a.which, Which::Cache | Which::All) {
        let text_2k = micro::text_of(&bundle, 2048)?;
        println!("== block prefix cache ({} blocks cached)", a.cache_blocks);
        let c = micro::cache(a.cache_blocks, 20_000);
        println!(
            "   lookup+pin+insert+release: {:.0} ns per block (goal < 1000 ns: {})",
            c.ns_per_block,
            if c.ns_per_block < 1000.0 {
                "met"
            } else {
                "MISSED"
            }
        );
        println!("== tokenizer (native, SmolLM2 vocabulary)");
        let t = micro::tokenizer(&bundle, &text_2k, 500)?;
        println!("   {:.0} tokens/s encoding a {}-token prompt not seen before; parse+tokenize+hash {:.0} µs per request", t.tokens_per_sec, t.prompt_tokens, t.prepare_us);
        println!("== tokenize time by input size, 1 KiB to 4 MiB (native; linear = flat ms/MiB, slope 1)");
        let scaling = micro::tokenize_scaling(&bundle)?;
        let mut last = "";
        for r in &scaling {
            if r.input != last {
                last = r.input;
                println!(
                    "   {:<28} slope {:.2}",
                    r.input,
                    micro::slope(&scaling, r.input)
                );
            }
            println!(
                "     {:>8} KiB {:>10.2} ms {:>9.1} ms/MiB",
                r.bytes >> 10,
                r.ms,
                r.ms_per_mib
            );
        }
        println!(
            "== model server, sim engine at zero cost, the same 2k-token prompt, {} connections, {} s",
            a.connections, a.seconds
        );
        let s = server(&text_2k, a.seconds, a.connections)?;
        println!(
            "   {:.0} requests/s, p50 {:.2} ms, p99 {:.2} ms, errors {}",
            s.requests_per_sec, s.p50_ms, s.p99_ms, s.errors
        );
        summary.insert(
            "cache".into(),
            serde_json::json!({"cache": c, "tokenizer": t, "tokenize_scaling": scaling, "server": s}),
        );
    }
    if matches!(a.which, Which::Filter | Which::All) || (a.which == Which::Policies && !a.quick) {
        let seconds = if a.which == Which::Policies {
            3
        } else {
            a.seconds
        };
        println!("== filter overhead: Envoy (--concurrency 2) with vs without the filter, {} zero-cost pod(s), unique prompts, {seconds} s each", a.overhead_pods);
        let chosen = match a.overhead_cases.as_slice() {
            [] => &OverheadCase::ALL[..],
            some => some,
        };
        // one text per prompt size, shared by the loads of that size and the families
        let mut texts = std::collections::BTreeMap::new();
        let mut cases = Vec::with_capacity(chosen.len());
        for case in chosen {
            let (tokens, prompts) = case.load();
            let text = match texts.entry(tokens) {
                Entry::Occupied(e) => e.into_mut(),
                Entry::Vacant(e) => e.insert(micro::text_of(&bundle, tokens)?),
            };
            cases.push((tokens, text.clone(), prompts));
        }
        let (rows, vm) = overhead::run(&cases, a.overhead_pods, seconds, a.connections, &a.out)?;
        let label = |r: &overhead::OverheadRow| format!("{}{}", r.prompt_tokens, r.prompts.label());
        println!("   saturated ({} connections):", a.connections);
        println!("   tokens       rps(no filter)  rps(filter)  ratio  p50 no/with (ms)   p99 no/with (ms)   added p50");
        for r in &rows {
            println!(
                "   {:<11}  {:>14.0}  {:>11.0}  {:>5.2}  {:>7.2} / {:<7.2}  {:>7.2} / {:<7.2}  {:+.2} ms",
                label(r), r.without_filter.requests_per_sec, r.with_filter.requests_per_sec, r.rps_ratio,
                r.without_filter.p50_ms, r.with_filter.p50_ms, r.without_filter.p99_ms, r.with_filter.p99_ms, r.added_p50_ms
            );
        }
        println!("   unloaded (1 connection, no queueing):");
        println!("   tokens       p50 no/with (ms)   p99 no/with (ms)   added p50");
        for r in &rows {
            let (u, w) = (&r.unloaded_without_filter, &r.unloaded_with_filter);
            println!(
                "   {:<11}  {:>7.2} / {:<7.2}  {:>7.2} / {:<7.2}  {:+.2} ms",
                label(r),
                u.p50_ms,
                w.p50_ms,
                u.p99_ms,
                w.p99_ms,
                r.added_p50_unloaded_ms
            );
        }
        println!(
            "   inside the filter under the saturated load (its own histograms, p50 / p99 µs):"
        );
        println!("   tokens       route total      of which tokenize");
        for r in &rows {
            println!(
                "   {:<11}  {:>15}  {:>15}",
                label(r),
                p50_p99(r.filter_route_us),
                p50_p99(r.filter_tokenize_us)
            );
        }
        println!("   the same loads through other fronts (req/s saturated, ratio to Envoy alone; p50 added to one unloaded request over sending it straight to the pod):");
        println!("   tokens       direct          Envoy alone       Envoy + floor wasm     Envoy + filter       sglang-router cache_aware   filter / sglang");
        for r in &rows {
            // req/s, its ratio to Envoy alone's, and the p50 added unloaded over a direct call
            let cell = |sat: &crate::wrk::LoadResult, unloaded: &crate::wrk::LoadResult| {
                format!(
                    "{:>6.0} {:>4.2}× {:+.2}ms",
                    sat.requests_per_sec,
                    sat.requests_per_sec / r.without_filter.requests_per_sec.max(1e-9),
                    r.added_over_direct_ms(unloaded).unwrap_or(f64::NAN)
                )
            };
            let front = |f: Option<&overhead::FrontLoad>| {
                f.map_or_else(|| "n/a".into(), |f| cell(&f.saturated, &f.unloaded))
            };
            println!(
                "   {:<11}  {:<14}  {:<16}  {:<21}  {:<19}  {:<26}  {}",
                label(r),
                r.direct.as_ref().map_or_else(
                    || "n/a".into(),
                    |d| format!("{:>6.0}", d.saturated.requests_per_sec)
                ),
                cell(&r.without_filter, &r.unloaded_without_filter),
                front(r.floor.as_ref()),
                cell(&r.with_filter, &r.unloaded_with_filter),
                front(r.sglang_cache_aware.as_ref()),
                r.filter_rps_over(r.sglang_cache_aware.as_ref())
                    .map_or_else(|| "n/a".into(), |x| format!("{x:.2}×"))
            );
        }
        println!("   the proxy process's CPU per request under the saturated load (µs, every thread; the filter's own = with − without):");
        println!("   tokens       Envoy alone  + floor wasm  + filter  filter's own  sglang-router cache_aware");
        for r in &rows {
            let us = |v: Option<f64>| v.map_or_else(|| "n/a".into(), |v| format!("{v:.0}"));
            println!(
                "   {:<11}  {:>11}  {:>12}  {:>8}  {:>12}  {:>25}",
                label(r),
                us(r.cpu_us_without_filter),
                us(r.floor.as_ref().and_then(|f| f.cpu_us)),
                us(r.cpu_us_with_filter),
                us(r.cpu_us_with_filter
                    .zip(r.cpu_us_without_filter)
                    .map(|(a, b)| a - b)),
                us(r.sglang_cache_aware.as_ref().and_then(|f| f.cpu_us)),
            );
        }
        if let Some(r) = rows
            .iter()
            .find(|r| r.prompt_tokens == 2048 && r.prompts == Prompts::Shuffled)
        {
            println!(
                "   at 2k shuffled tokens (nothing repeats but words): rps ratio {:.2}, added p50 {:.2} ms saturated, {:.2} ms unloaded",
                r.rps_ratio, r.added_p50_ms, r.added_p50_unloaded_ms
            );
        }
        if let Some(r) = rows
            .iter()
            .find(|r| r.prompt_tokens == 2048 && r.prompts == Prompts::Counter)
        {
            let met = |ok: bool| if ok { "met" } else { "MISSED" };
            println!(
                "   goals at 2k unique tokens: rps {:.2}× Envoy alone (goal ≥ 0.8: {}; the floor wasm filter alone: {}); added p50 unloaded {:.2} ms (goal ≤ 0.15: {}), saturated {:.2} ms",
                r.rps_ratio, met(r.rps_ratio >= 0.8),
                r.rps_over_plain(r.floor.as_ref()).map_or_else(|| "n/a".into(), |x| format!("{x:.2}×")),
                r.added_p50_unloaded_ms, met(r.added_p50_unloaded_ms <= 0.15),
                r.added_p50_ms,
            );
            if let Some(x) = r.filter_rps_over(r.sglang_cache_aware.as_ref()) {
                println!(
                    "   goal at 2k unique tokens: rps {x:.2}× sglang-router cache_aware's (goal ≥ 1.0: {})",
                    met(x >= 1.0)
                );
            }
        }
        println!(
            "   filter VMs: {} (start times {:?} ms); Envoy RSS {:.0} MB with vs {:.0} MB without → {:.1} MB per VM",
            vm.vm_start_ms.len(), vm.vm_start_ms, vm.envoy_rss_with_filter_mb, vm.envoy_rss_without_filter_mb, vm.mb_per_vm
        );
        let data = prefix_core::protocol::defaults::data_dir(&test_harness::paths::repo_root());
        let families = [
            ("SmolLM2-135M", model_server::config::default_model_dir()),
            ("Llama-3.2", data.join("tokenizers/llama-3.2")),
            ("Qwen2.5", data.join("tokenizers/qwen2.5")),
        ];
        // loads named on the command line: a quick comparison, without the families
        let fams = if a.overhead_cases.is_empty() {
            println!("   tokenizer families, fetched at start from files Envoy serves (one unloaded connection, unique ~2k-word prompts, {seconds} s each):");
            println!("   family                 tokenizer.json  per VM fetch / build (ms)   Envoy RSS (MB, plain {:.0})  added p50   route p50/p99 µs  tokenize p50/p99 µs", vm.envoy_rss_without_filter_mb);
            let text_2k = match texts.get(&2048) {
                Some(t) => t.clone(),
                None => micro::text_of(&bundle, 2048)?,
            };
            overhead::families(&families, &text_2k, seconds, &a.out)?
        } else {
            Vec::new()
        };
        for f in &fams {
            println!(
                "   {:<22} {:>8.1} MB     {:<27} {:>6.0}                      {:+.2} ms   {:>16}  {:>19}",
                f.family,
                f.tokenizer_json_bytes as f64 / 1e6,
                f.vm_load_ms.iter().map(|(a, b)| format!("{a}/{b}")).collect::<Vec<_>>().join(", "),
                f.envoy_rss_mb,
                f.added_p50_unloaded_ms,
                p50_p99(f.filter_route_us),
                p50_p99(f.filter_tokenize_us)
            );
        }
        summary.insert(
            "filter_overhead".into(),
            serde_json::json!({"rows": rows, "vm": vm, "families": fams}),
        );
    }
    if matches!(a.which, Which::Hostile | Which::All) {
        println!("== hostile requests through Envoy + filter and at a pod (2 zero-cost sim pods)");
        let rows = crate::hostile::run()?;
        print!("{}", crate::hostile::table(&rows));
        summary.insert("hostile".into(), serde_json::to_value(&rows)?);
    }
    if a.which == Which::Vllm {
        let requests = a
            .saturated_requests
            .unwrap_or(if a.quick { 48 } else { 192 });
        println!(
            "== real vLLM pods (3, CPU build, {}-block caches) with kv-events sidecars: {requests} shared-prefix requests, 6 clients, per front",
            crate::vllm_fleet::CACHE_BLOCKS
        );
        let dir = test_harness::cluster::run_dir("bench-vllm");
        let rows = crate::vllm_fleet::run(requests, 6, &dir)?;
        summary.insert("vllm".into(), serde_json::to_value(&rows)?);
    }
    if a.which == Which::Faults {
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
        summary.insert("faults".into(), serde_json::to_value(&r)?);
    }
    if matches!(a.which, Which::Engine | Which::All) {
        println!(
            "== real engine (candle, SmolLM2-135M Q4_1, CPU): TTFT cold vs with cached blocks"
        );
        let model =
            model_server::engine::llama::Llama::load(&model_server::config::default_model_file())?;
        let text = micro::text_of(&bundle, 8 * 128 + 300)?;
        let ids = bundle.tokenizer().encode(&text)?;
        let r = engine::run(&model, &ids, 128)?;
        println!("   cached blocks  prompt tokens  cold TTFT  warm TTFT  warm/cold");
        for row in &r.rows {
            println!(
                "   {:>13}  {:>13}  {:>7.0}ms  {:>7.0}ms  {:>9.2}",
                row.cached_blocks, row.prompt_tokens, row.cold_ttft_ms, row.warm_ttft_ms, row.ratio
            );
        }
        if let Some(six) = r.rows.iter().find(|x| x.cached_blocks == 6) {
            println!(
                "   goal: 6 cached blocks TTFT ≤ 0.1× cold: {:.2} ({})",
                six.ratio,
                if six.ratio <= 0.1 { "met" } else { "MISSED" }
            );
        }
        println!(
            "   prefill {:.0} tokens/s, decode {:.1} tokens/s, {:.1} MiB per cached block",
            r.prefill_tokens_per_s,
            r.decode_tokens_per_s,
            r.bytes_per_block as f64 / (1024.0 * 1024.0)
        );
        println!(
            "   {} sequences decoding together: {:.1} tokens/s in all, {:.2}× one sequence's (goal ≥ 4: {})",
            engine::BATCH,
            r.batched_decode_tokens_per_s,
            r.batched_over_single,
            if r.batched_over_single >= 4.0 { "met" } else { "MISSED" }
        );
        summary.insert("engine".into(), serde_json::to_value(&r)?);
        match llama_cpp_beside(&ids, &r) {
            Ok(l) => {
                summary.insert("engine_llama_cpp".into(), serde_json::to_value(&l)?);
            }
            // llama-server is built once per machine by scripts/setup.sh; without it the
            // candle figures still stand on their own
            Err(e) => println!("   llama.cpp not measured: {e:#}"),
        }
        let c = engine::concurrency(
            &ids,
            &test_harness::cluster::run_dir("bench-engine-concurrency"),
        )?;
        println!(
            "   over HTTP, one pod (--max-num-seqs {n}), {}-token prompts, up to {} tokens each: one request {:.1} tokens/s, {n} at once {:.1} tokens/s in all, {:.2}× (goal ≥ 4: {})",
            c.prompt_tokens,
            c.max_tokens,
            c.alone_tokens_per_s,
            c.together_tokens_per_s,
            c.ratio,
            if c.ratio >= 4.0 { "met" } else { "MISSED" },
            n = engine::BATCH,
        );
        summary.insert("engine_concurrency".into(), serde_json::to_value(&c)?);
        match engine::llama_cpp_concurrency(
            &ids,
            &test_harness::cluster::run_dir("bench-engine-concurrency-llama-cpp"),
        ) {
            Ok(l) => {
                println!(
                    "   llama.cpp llama-server (--parallel {n}), the same requests: one request {:.1} tokens/s, {n} at once {:.1} tokens/s in all, {:.2}× (candle's ratio / llama.cpp's: {:.2})",
                    l.alone_tokens_per_s,
                    l.together_tokens_per_s,
                    l.ratio,
                    c.ratio / l.ratio,
                    n = engine::BATCH,
                );
                summary.insert(
                    "engine_concurrency_llama_cpp".into(),
                    serde_json::to_value(&l)?,
                );
            }
            Err(e) => println!("   llama.cpp concurrency not measured: {e:#}"),
        }
    }
    write_json(&a.out, "results", &summary)?;
    println!("results written to {}", a.out.display());
    Ok(())
}

/// llama.cpp on the same prompts, printed as ratios beside the candle engine's figures.
fn llama_cpp_beside(
    ids: &[u32],
    r: &engine::EngineResult,
) -> anyhow::Result<crate::llama_cpp::LlamaCpp> {
    let prompts: Vec<&[u32]> = r.rows.iter().map(|row| &ids[..row.prompt_tokens]).collect();
    let six = r
        .rows
        .iter()
        .find(|x| x.cached_blocks == 6)
        .ok_or_else(|| anyhow::anyhow!("no 6-block row"))?;
    let l = crate::llama_cpp::run(
        &prompts,
        &ids[..engine::DECODE_AFTER],
        &ids[..six.prompt_tokens],
        &test_harness::cluster::run_dir("bench-engine-llama-cpp"),
    )?;
    let verdict = |ok: bool| if ok { "met" } else { "MISSED" };
    let (prefill, decode) = (
        r.prefill_tokens_per_s / l.prefill_tokens_per_s,
        r.decode_tokens_per_s / l.decode_tokens_per_s,
    );
    println!(
        "   llama.cpp llama-server (same GGUF, 2 threads, its own timings): prefill {:.0} tokens/s, decode {:.1} tokens/s, 6 cached blocks {:.0} ms vs {:.0} ms cold ({:.2})",
        l.prefill_tokens_per_s,
        l.decode_tokens_per_s,
        l.warm6_ms,
        l.cold6_ms,
        l.warm6_ms / l.cold6_ms
    );
    println!(
        "   candle / llama.cpp: prefill {prefill:.2}× (goal ≥ 1: {}), decode {decode:.2}× (goal ≥ 1: {})",
        verdict(prefill >= 1.0),
        verdict(decode >= 1.0)
    );
    Ok(l)
}

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
