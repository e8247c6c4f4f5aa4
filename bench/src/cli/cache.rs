//! `bench cache`: the prefix cache's cost per block, the tokenizer's throughput and its
//! scaling with input size, and the sim server's requests/s.

use super::{Args, Summary};
use crate::{micro, server};
use prefix_core::model::ModelBundle;

/// Runs it; what it measured, for the summary.
pub fn run(a: &Args, bundle: &ModelBundle) -> anyhow::Result<Summary> {
    let mut out = serde_json::Map::new();
    let text_2k = micro::text_of(bundle, 2048)?;
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
    let t = micro::tokenizer(bundle, &text_2k, 500)?;
    println!("   {:.0} tokens/s encoding a {}-token prompt not seen before; parse+tokenize+hash {:.0} µs per request", t.tokens_per_sec, t.prompt_tokens, t.prepare_us);
    println!(
        "== tokenize time by input size, 1 KiB to 4 MiB (native; linear = flat ms/MiB, slope 1)"
    );
    let scaling = micro::tokenize_scaling(bundle)?;
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
    out.insert(
        "cache".into(),
        serde_json::json!({"cache": c, "tokenizer": t, "tokenize_scaling": scaling, "server": s}),
    );
    Ok(out)
}
