//! `bench filter`: the filter's overhead (Envoy with and without it, beside the pod alone, a
//! floor filter and sglang-router), the filter's own time, CPU per request, and the
//! tokenizer families fetched at start.

use super::{p50_p99, Args, OverheadCase, Summary, Which};
use crate::micro;
use crate::overhead::{self, Prompts};
use prefix_core::model::ModelBundle;
use std::collections::btree_map::Entry;

/// Runs it; what it measured, for the summary.
pub fn run(a: &Args, bundle: &ModelBundle) -> anyhow::Result<Summary> {
    let mut out = serde_json::Map::new();
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
            Entry::Vacant(e) => e.insert(micro::text_of(bundle, tokens)?),
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
    println!("   inside the filter under the saturated load (its own histograms, p50 / p99 µs):");
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
    // the .wasm carries no vocabulary (the model's files come from Envoy at start)
    let wasm_bytes = std::fs::metadata(test_harness::paths::wasm_path())?.len();
    println!(
        "   filter .wasm: {:.2} MB (goal < 2 MB: {})",
        wasm_bytes as f64 / 1e6,
        if wasm_bytes < 2_000_000 {
            "met"
        } else {
            "MISSED"
        }
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
            None => micro::text_of(bundle, 2048)?,
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
    out.insert(
        "filter_overhead".into(),
        serde_json::json!({"rows": rows, "vm": vm, "families": fams, "wasm_bytes": wasm_bytes}),
    );
    Ok(out)
}
