//! `bench`: prefix-router's benchmarks (run via `scripts/bench.sh`). Prints a table and writes
//! JSON under `--out`. Goals are reported as ratios, never asserted.

use clap::{Parser, ValueEnum};
use std::path::PathBuf;
use test_harness::bench::{micro, overhead, server, write_json};

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Which {
    /// cache lookup+insert per block, tokenizer throughput, server requests/s
    Cache,
    /// filter overhead: Envoy with vs without the filter, 128 / 2k / 8k-token prompts
    Filter,
    All,
}

#[derive(Parser)]
#[command(about)]
struct Args {
    #[arg(value_enum, default_value_t = Which::All)]
    which: Which,
    /// Seconds of load per measurement.
    #[arg(long, default_value_t = 10)]
    seconds: u32,
    /// Concurrent connections of the load generator.
    #[arg(long, default_value_t = 8)]
    connections: u32,
    /// Blocks cached in the cache benchmark.
    #[arg(long, default_value_t = 1_000_000)]
    cache_blocks: usize,
    /// Output directory.
    #[arg(long, default_value = "bench-results/latest")]
    out: PathBuf,
}

fn main() -> anyhow::Result<()> {
    let a = Args::parse();
    std::fs::create_dir_all(&a.out)?;
    let bundle = micro::default_bundle()?;
    let text_2k = micro::text_of(&bundle, 2048)?;
    if matches!(a.which, Which::Cache | Which::All) {
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
        write_json(&a.out, "cache", &c)?;
        println!("== tokenizer (native, SmolLM2 vocabulary)");
        let t = micro::tokenizer(&bundle, &text_2k, 50)?;
        println!("   {:.0} tokens/s encoding a {}-token prompt; parse+tokenize+hash {:.0} µs per request", t.tokens_per_sec, t.prompt_tokens, t.prepare_us);
        write_json(&a.out, "tokenizer", &t)?;
        println!(
            "== model server, sim engine at zero cost, 2k-token prompts, {} connections, {} s",
            a.connections, a.seconds
        );
        let s = server(&text_2k, a.seconds, a.connections)?;
        println!(
            "   {:.0} requests/s, p50 {:.2} ms, p99 {:.2} ms, errors {}",
            s.requests_per_sec, s.p50_ms, s.p99_ms, s.errors
        );
        write_json(&a.out, "server", &s)?;
    }
    if matches!(a.which, Which::Filter | Which::All) {
        println!("== filter overhead: Envoy (--concurrency 2) with vs without the filter, one zero-cost pod, unique prompts");
        let texts = vec![
            (128, micro::text_of(&bundle, 128)?),
            (2048, text_2k.clone()),
            (8000, micro::text_of(&bundle, 8000)?),
        ];
        let (rows, vm) = overhead::run(&texts, a.seconds, a.connections, &a.out)?;
        println!("   tokens  rps(no filter)  rps(filter)  ratio  p50 no/with (ms)   p99 no/with (ms)   added p50");
        for r in &rows {
            println!(
                "   {:>6}  {:>14.0}  {:>11.0}  {:>5.2}  {:>7.2} / {:<7.2}  {:>7.2} / {:<7.2}  {:+.2} ms",
                r.prompt_tokens, r.without_filter.requests_per_sec, r.with_filter.requests_per_sec, r.rps_ratio,
                r.without_filter.p50_ms, r.with_filter.p50_ms, r.without_filter.p99_ms, r.with_filter.p99_ms, r.added_p50_ms
            );
        }
        if let Some(r) = rows.iter().find(|r| r.prompt_tokens == 2048) {
            println!(
                "   goals at 2k tokens: added p50 {:.2} ms (goal ≤ 1 ms: {}), rps ratio {:.2} (goal ≥ 0.8: {})",
                r.added_p50_ms, if r.added_p50_ms <= 1.0 { "met" } else { "MISSED" },
                r.rps_ratio, if r.rps_ratio >= 0.8 { "met" } else { "MISSED" }
            );
        }
        println!(
            "   filter VMs: {} (start times {:?} ms); Envoy RSS {:.0} MB with vs {:.0} MB without → {:.1} MB per VM",
            vm.vm_start_ms.len(), vm.vm_start_ms, vm.envoy_rss_with_filter_mb, vm.envoy_rss_without_filter_mb, vm.mb_per_vm
        );
        write_json(&a.out, "filter-overhead", &rows)?;
        write_json(&a.out, "filter-vm", &vm)?;
    }
    println!("results written to {}", a.out.display());
    Ok(())
}
