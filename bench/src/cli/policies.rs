//! `bench policies` (the default): prefix routing against the other policies and the peer
//! routers, on the open-loop workloads, the closed-loop ones and inference-perf's.

use super::{Args, Summary};
use crate::inference_perf::{self, IpWorkload};
use crate::peers::{Front, FRONTS};
use crate::policies::{
    run_all, Saturation, SimCosts, HOT_SATURATED, IP_HOT_GROUPS, IP_LONG_PREFIX, IP_MANY_GROUPS,
    LONG_SATURATED, SATURATED,
};
use crate::trace::{TraceParams, Workload};
use crate::{plots, repeats, report};
use prefix_core::model::ModelBundle;

/// Runs it; what it measured, for the summary.
pub fn run(a: &Args, bundle: &ModelBundle) -> anyhow::Result<Summary> {
    let mut out = serde_json::Map::new();
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
        question_words: (8, 24),
        max_tokens: 16,
    };
    let named = |name: &str| a.only.is_empty() || a.only.iter().any(|n| n == name);
    let mut workloads = if a.workloads.is_empty() {
        Workload::ALL.to_vec()
    } else {
        a.workloads.clone()
    };
    workloads.retain(|w| named(w.name()));
    // closed loop: as many clients as the fleet has sequence slots; 16 tenants with
    // 2k–6k-token contexts against 256-block (32k-token) pod caches, about 8 contexts each;
    // then 4 tenants, which every pod's cache holds; then 16 tenants with 4k–8k-token
    // contexts and 240–480-token questions against 128-block (16k-token) caches, which hold
    // two or three contexts each (a fifth of the working set)
    let sat_requests = a
        .saturated_requests
        .unwrap_or(if a.quick { 64 } else { 1000 });
    let mut saturations: Vec<Saturation> = [
        (SATURATED, 16, 256, None, None),
        (HOT_SATURATED, 4, 256, None, None),
        (
            LONG_SATURATED,
            16,
            128,
            Some((3400, 6800)),
            Some((200, 400)),
        ),
    ]
    .map(
        |(name, tenants, cache_blocks, context_words, question_words)| Saturation {
            name,
            concurrency: a.pods * costs.max_num_seqs,
            tenants,
            requests: sat_requests,
            cache_blocks,
            context_words,
            question_words,
        },
    )
    .to_vec();
    // the closed-loop runs replay the shared-prefix shape: skipped when other open-loop
    // workloads alone are asked for
    if !a.workloads.is_empty() && !a.workloads.contains(&Workload::SharedPrefix) {
        saturations.clear();
    }
    saturations.retain(|s| named(s.name));
    // the same three situations generated and sent by inference-perf: 32 groups of 2k-token
    // system prompts (more than one pod's cache holds), 4 groups (every pod's holds), and 16
    // groups of 4k-token prompts with 256-token questions against 128-block caches
    let mut external: Vec<IpWorkload> =
        if a.inference_perf.unwrap_or(!a.quick) && inference_perf::installed() {
            [
                (IP_MANY_GROUPS, 32, 2048, 64, 256),
                (IP_HOT_GROUPS, 4, 2048, 64, 256),
                (IP_LONG_PREFIX, 16, 4096, 256, 128),
            ]
            .map(
                |(name, groups, system_prompt_len, question_len, cache_blocks)| IpWorkload {
                    name,
                    groups,
                    system_prompt_len,
                    question_len,
                    output_len: 16,
                    requests: sat_requests,
                    concurrency: a.pods * costs.max_num_seqs,
                    cache_blocks,
                },
            )
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
    external.retain(|w| named(w.name));
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
    println!(
        "   inference-perf (external load generator, its own shared-prefix prompts): {external:?}"
    );
    println!(
        "   trace: {params:?}; workloads {:?}; fronts {:?}",
        workloads.iter().map(|w| w.name()).collect::<Vec<_>>(),
        fronts.iter().map(|f| f.name()).collect::<Vec<_>>()
    );
    let mut runs = Vec::new();
    for run in 1..=a.repeat.max(1) {
        if a.repeat > 1 {
            println!("-- run {run} of {}", a.repeat);
        }
        let mut these = run_all(
            bundle,
            &workloads,
            &fronts,
            &params,
            a.pods,
            &costs,
            &saturations,
            &external,
            &a.out,
        )?;
        these.iter_mut().for_each(|r| r.run = run);
        print!("{}", report::table(&these));
        runs.extend(these);
    }
    // the goals read the medians over the runs (a single run's own figures when not repeated)
    let medians = repeats::medians(&runs);
    if a.repeat > 1 {
        println!("medians over {} runs [range]:", a.repeat);
        print!("{}", repeats::table(&runs));
    }
    let goals = report::goals(&medians) + &report::peer_goals(&medians);
    print!("{goals}");
    report::write_csv(&runs, &a.out.join("results.csv"))?;
    let files = plots::write_all(&medians, &a.out)?;
    println!("   plots: {}", files.join(", "));
    out.insert("policies".into(), serde_json::json!({"sim_costs": costs, "trace": params, "pods": a.pods, "repeat": a.repeat, "runs": runs, "medians": medians, "goals": goals}));
    Ok(out)
}
