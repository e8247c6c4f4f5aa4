//! `bench policies` (the default): prefix routing against the other policies and the peer
//! routers, on the open-loop workloads, the closed-loop ones and inference-perf's.

use super::{Args, Summary};
use crate::inference_perf::{self, IpWorkload};
use crate::peers::{Front, FRONTS};
use crate::policies::{
    run_all, Saturation, SimCosts, HOT_SATURATED, IP_HOT_GROUPS, IP_MANY_GROUPS, SATURATED,
};
use crate::trace::{TraceParams, Workload};
use crate::{plots, report};
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
    println!(
        "   inference-perf (external load generator, its own shared-prefix prompts): {external:?}"
    );
    println!(
        "   trace: {params:?}; workloads {:?}; fronts {:?}",
        workloads.iter().map(|w| w.name()).collect::<Vec<_>>(),
        fronts.iter().map(|f| f.name()).collect::<Vec<_>>()
    );
    let runs = run_all(
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
    print!("{}", report::table(&runs));
    let goals = report::goals(&runs) + &report::peer_goals(&runs);
    print!("{goals}");
    report::write_csv(&runs, &a.out.join("results.csv"))?;
    let files = plots::write_all(&runs, &a.out)?;
    println!("   plots: {}", files.join(", "));
    out.insert("policies".into(), serde_json::json!({"sim_costs": costs, "trace": params, "pods": a.pods, "runs": runs, "goals": goals}));
    Ok(out)
}
