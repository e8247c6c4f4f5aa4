//! A tiny run of the policy benchmark, with a real peer router (sglang-router, installed by
//! setup) as one of the fronts: output files exist and the numbers are internally consistent
//! (not that any front wins).

use prefix_router_bench::inference_perf::IpWorkload;
use prefix_router_bench::micro::default_bundle;
use prefix_router_bench::peers::{Front, Peer};
use prefix_router_bench::policies::{run_all, Saturation, SimCosts, SATURATED};
use prefix_router_bench::trace::{TraceParams, Workload};
use prefix_router_bench::{plots, report};

#[test]
fn policy_bench_smoke() {
    let out = test_harness::cluster::run_dir("bench-smoke-out");
    std::fs::create_dir_all(&out).unwrap();
    let bundle = default_bundle().unwrap();
    let params = TraceParams {
        seed: 1,
        requests: 8,
        rate: 20.0,
        tenants: 2,
        context_words: (150, 300),
        question_words: (8, 24),
        max_tokens: 4,
    };
    let costs = SimCosts {
        ttft_base_ms: 1.0,
        prefill_us_per_token: 20.0,
        decode_ms_per_token: 1.0,
        max_num_seqs: 4,
    };
    let workloads = [Workload::SharedPrefix, Workload::MultiTurn];
    let runs = run_all(
        &bundle,
        &workloads,
        &[
            Front::Envoy("prefix"),
            Front::Envoy("round_robin"),
            Front::Peer(Peer::Sglang, "cache_aware"),
        ],
        &params,
        2,
        &costs,
        &[Saturation {
            name: SATURATED,
            concurrency: 3,
            tenants: 3,
            requests: params.requests,
            cache_blocks: 64,
            // the long-prefix shape: its own context and question lengths
            context_words: Some((400, 600)),
            question_words: Some((40, 60)),
        }],
        &[IpWorkload {
            name: "ip-tiny",
            groups: 2,
            system_prompt_len: 300,
            question_len: 16,
            output_len: 4,
            requests: 8,
            concurrency: 2,
            cache_blocks: 64,
        }],
        &out,
    )
    .unwrap();
    // 2 workloads × 3 fronts, plus shared-prefix replayed closed-loop per front, plus
    // inference-perf's own workload per front
    assert_eq!(runs.len(), 12);
    assert_eq!(runs.iter().filter(|r| r.workload == SATURATED).count(), 3);
    assert_eq!(
        runs.iter()
            .filter(|r| r.policy == "sglang-router cache_aware")
            .count(),
        4
    );
    for r in &runs {
        let what = format!("{} / {}", r.workload, r.policy);
        assert_eq!(
            r.requests, params.requests,
            "{what}: every request accounted for"
        );
        assert_eq!(r.ok + r.errors, r.requests, "{what}");
        assert_eq!(r.errors, 0, "{what}");
        assert_eq!(
            r.per_pod.iter().sum::<f64>(),
            r.ok as f64,
            "{what}: pods served every request"
        );
        assert!(r.hit_tokens <= r.prompt_tokens, "{what}: hits ≤ queries");
        if r.workload != "ip-tiny" {
            assert_eq!(
                r.prompt_tokens, r.oracle.prompt_tokens as f64,
                "{what}: pods and oracle tokenize alike"
            );
            assert!(
                r.hit_tokens <= r.oracle.reusable_tokens as f64,
                "{what}: the oracle bounds what any policy reuses"
            );
        } else {
            assert!(
                r.prompt_tokens > 0.0,
                "{what}: inference-perf's prompts reached the pods"
            );
        }
        assert!(
            r.ttft_p50_ms <= r.ttft_p90_ms && r.ttft_p90_ms <= r.ttft_p99_ms,
            "{what}"
        );
        assert!(r.ttft_p99_ms <= r.e2e_p99_ms, "{what}");
        // the filter's own time, read from Envoy's histograms before it stopped
        match r.policy {
            "prefix" => assert!(
                r.filter.route_us.is_some() && r.filter.tokenize_us.is_some(),
                "{what}: {:?}",
                r.filter
            ),
            "sglang-router cache_aware" => {
                assert_eq!(r.filter, Default::default(), "{what}: no filter")
            }
            _ => {}
        }
        assert!(
            r.requests_per_s > 0.0 && r.output_tokens_per_s > 0.0,
            "{what}"
        );
    }
    report::write_csv(&runs, &out.join("results.csv")).unwrap();
    let files = plots::write_all(&runs, &out).unwrap();
    for f in files.iter().chain(
        [
            "results.csv".to_owned(),
            "trace-shared-prefix.jsonl".to_owned(),
            "ttft-cdf-multi-turn.svg".to_owned(),
        ]
        .iter(),
    ) {
        let p = out.join(f);
        assert!(
            p.is_file() && std::fs::metadata(&p).unwrap().len() > 100,
            "{} missing or empty",
            p.display()
        );
    }
    let csv = std::fs::read_to_string(out.join("results.csv")).unwrap();
    assert_eq!(csv.lines().count(), 1 + runs.len());
    assert!(report::table(&runs).contains("round_robin"));
    assert!(report::peer_goals(&runs).contains("best peer"));
}
