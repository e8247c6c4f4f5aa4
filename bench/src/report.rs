//! The policy comparison as a table, JSON and CSV, plus the goals as ratios.

use super::overhead::FilterTimes;
use super::policies::{PolicyRun, HOT_SATURATED, IP_HOT_GROUPS, IP_MANY_GROUPS, SATURATED};
use std::fmt::Write as _;
use std::path::Path;

fn find<'a>(runs: &'a [PolicyRun], w: &str, p: &str) -> Option<&'a PolicyRun> {
    runs.iter().find(|r| r.workload == w && r.policy == p)
}

pub fn table(runs: &[PolicyRun]) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "{:<23} {:<25} {:>5} {:>4} {:>9} {:>9} {:>9} {:>9} {:>7} {:>8} {:>6} {:>6} {:>6} {:>6} {:>8} {:>11}",
        "workload", "policy", "reqs", "err", "ttft p50", "ttft p90", "ttft p99", "e2e p90", "req/s", "out tok/s", "hit", "oracle", "vs or.", "spread", "cpu/1k", "filter µs"
    );
    for r in runs {
        let _ = writeln!(
            s,
            "{:<23} {:<25} {:>5} {:>4} {:>7.0}ms {:>7.0}ms {:>7.0}ms {:>7.0}ms {:>7.2} {:>9.1} {:>6.3} {:>6.3} {:>6.2} {:>6.2} {:>7.2}s {:>11}",
            r.workload, r.policy, r.requests, r.errors, r.ttft_p50_ms, r.ttft_p90_ms, r.ttft_p99_ms, r.e2e_p90_ms, r.requests_per_s,
            r.output_tokens_per_s, r.hit_rate, r.oracle.hit_rate, r.hit_rate_vs_oracle, r.spread, r.front_cpu_s_per_1k,
            filter_p50s(&r.filter)
        );
    }
    s
}

/// The filter's route and tokenize p50s over a run, `route/tokenize` in µs; `-` where no
/// filter ran (a peer router, the floor filter).
fn filter_p50s(f: &FilterTimes) -> String {
    match (f.route_us, f.tokenize_us) {
        (Some((route, _)), Some((tokenize, _))) => format!("{route:.0}/{tokenize:.0}"),
        (Some((route, _)), None) => format!("{route:.0}/-"),
        _ => "-".to_owned(),
    }
}

/// The goals, as measured ratios (reported, never asserted).
pub fn goals(runs: &[PolicyRun]) -> String {
    let mut s = String::new();
    let mark = |ok: bool| if ok { "met" } else { "MISSED" };
    if let (Some(p), Some(rr)) = (
        find(runs, "shared-prefix", "prefix"),
        find(runs, "shared-prefix", "round_robin"),
    ) {
        let _ = writeln!(
            s,
            "shared-prefix: hit rate {:.2}× oracle (goal ≥ 0.95: {})",
            p.hit_rate_vs_oracle,
            mark(p.hit_rate_vs_oracle >= 0.95)
        );
        let r = p.ttft_p90_ms / rr.ttft_p90_ms;
        let _ = writeln!(
            s,
            "shared-prefix: TTFT p90 {:.2}× round-robin's (goal ≤ 0.20: {})",
            r,
            mark(r <= 0.2)
        );
    }
    // Throughput: the closed-loop replay (the open-loop one follows the offered rate).
    if let (Some(p), Some(rr)) = (
        find(runs, SATURATED, "prefix"),
        find(runs, SATURATED, "round_robin"),
    ) {
        let t = p.requests_per_s / rr.requests_per_s;
        let _ = writeln!(
            s,
            "shared-prefix: throughput at saturation {:.2}× round-robin's ({:.1} vs {:.1} req/s; goal ≥ 1.8: {})",
            t,
            p.requests_per_s,
            rr.requests_per_s,
            mark(t >= 1.8)
        );
    }
    if let (Some(p), Some(rr)) = (
        find(runs, "all-unique", "prefix"),
        find(runs, "all-unique", "round_robin"),
    ) {
        let r = p.ttft_p90_ms / rr.ttft_p90_ms;
        let _ = writeln!(
            s,
            "all-unique: TTFT p90 {:.2}× round-robin's (goal within 5%: {})",
            r,
            mark(r <= 1.05)
        );
    }
    if let (Some(p), Some(ll)) = (
        find(runs, "hot-tenant", "prefix"),
        find(runs, "hot-tenant", "least_loaded"),
    ) {
        let r = p.ttft_p90_ms / ll.ttft_p90_ms;
        let _ = writeln!(s, "hot-tenant: TTFT p90 {:.2}× least-loaded's (goal ≤ 1.2: {}), hit rate {:.2}× oracle (goal ≥ 0.8: {})", r, mark(r <= 1.2), p.hit_rate_vs_oracle, mark(p.hit_rate_vs_oracle >= 0.8));
    }
    s
}

/// Against the peer routers (reported when their rows are there): on each shared-prefix
/// workload, this router's req/s (policies `prefix` and `cost`), TTFT p90 and hit rate as ratios of the best peer's and of
/// round robin's; and the proxies' own comparability (round robin through each).
pub fn peer_goals(runs: &[PolicyRun]) -> String {
    let mut s = String::new();
    let mark = |ok: bool| if ok { "met" } else { "MISSED" };
    let is_peer_aware = |r: &&PolicyRun| r.policy.ends_with("-router cache_aware");
    if !runs.iter().any(|r| is_peer_aware(&r)) {
        return s;
    }
    let _ = writeln!(
        s,
        "against the peers (best peer = the better cache_aware router on that measure):"
    );
    for (w, ours) in [
        SATURATED,
        HOT_SATURATED,
        IP_MANY_GROUPS,
        IP_HOT_GROUPS,
        "shared-prefix",
        "hot-tenant",
        "multi-turn",
    ]
    .into_iter()
    .flat_map(|w| ["prefix", "cost"].map(|ours| (w, ours)))
    {
        let (Some(p), Some(rr)) = (find(runs, w, ours), find(runs, w, "round_robin")) else {
            continue;
        };
        let peers: Vec<&PolicyRun> = runs
            .iter()
            .filter(|r| r.workload == w)
            .filter(is_peer_aware)
            .collect();
        let best_rps = peers
            .iter()
            .map(|r| r.requests_per_s)
            .fold(f64::NAN, f64::max);
        let best_p90 = peers.iter().map(|r| r.ttft_p90_ms).fold(f64::NAN, f64::min);
        let best_hit = peers.iter().map(|r| r.hit_rate).fold(f64::NAN, f64::max);
        let (rps_peer, rps_rr) = (
            p.requests_per_s / best_rps,
            p.requests_per_s / rr.requests_per_s,
        );
        let (p90_peer, p90_rr) = (p.ttft_p90_ms / best_p90, p.ttft_p90_ms / rr.ttft_p90_ms);
        // an external generator's runs have no oracle (its prompts are not known here)
        let oracle = if p.hit_rate_vs_oracle.is_nan() {
            "n/a".to_owned()
        } else {
            format!(
                "{:.2}× oracle (≥ 0.95: {})",
                p.hit_rate_vs_oracle,
                mark(p.hit_rate_vs_oracle >= 0.95)
            )
        };
        let _ = writeln!(
            s,
            "  {w}, {ours}: req/s {rps_peer:.2}× best peer (goal ≥ 1.2: {}), {rps_rr:.2}× round robin (≥ 1.0: {}); TTFT p90 {p90_peer:.2}× best peer (≤ 0.8: {}), {p90_rr:.2}× round robin (≤ 1.0: {}); hit rate {:.3} vs best peer {best_hit:.3} ({}), {oracle}",
            mark(rps_peer >= 1.2), mark(rps_rr >= 1.0), mark(p90_peer <= 0.8), mark(p90_rr <= 1.0),
            p.hit_rate, mark(p.hit_rate >= best_hit)
        );
    }
    for w in [SATURATED, HOT_SATURATED, IP_MANY_GROUPS, IP_HOT_GROUPS] {
        if let (Some(e), Some(g)) = (
            find(runs, w, "round_robin"),
            find(runs, w, "sglang-router round_robin"),
        ) {
            let _ = writeln!(
                s,
                "  proxies alike ({w}, round robin through each): Envoy {:.1} req/s, TTFT p50 {:.0} ms; sglang-router {:.1} req/s, TTFT p50 {:.0} ms",
                e.requests_per_s, e.ttft_p50_ms, g.requests_per_s, g.ttft_p50_ms
            );
        }
    }
    s
}

/// An optional figure as a CSV field: empty when absent.
fn csv(v: Option<f64>) -> String {
    v.map(|v| format!("{v:.1}")).unwrap_or_default()
}

pub fn write_csv(runs: &[PolicyRun], path: &Path) -> anyhow::Result<()> {
    let mut s = String::from("workload,policy,requests,ok,errors,ttft_p50_ms,ttft_p90_ms,ttft_p99_ms,e2e_p50_ms,e2e_p90_ms,e2e_p99_ms,duration_s,requests_per_s,output_tokens_per_s,prompt_tokens,hit_tokens,hit_rate,oracle_hit_rate,hit_rate_vs_oracle,spread,front_cpu_s_per_1k,filter_route_p50_us,filter_route_p99_us,filter_tokenize_p50_us,filter_tokenize_p99_us\n");
    for r in runs {
        let _ = writeln!(
            s,
            "{},{},{},{},{},{:.3},{:.3},{:.3},{:.3},{:.3},{:.3},{:.3},{:.3},{:.3},{},{},{:.5},{:.5},{:.4},{:.3},{:.4},{},{},{},{}",
            r.workload, r.policy, r.requests, r.ok, r.errors, r.ttft_p50_ms, r.ttft_p90_ms, r.ttft_p99_ms, r.e2e_p50_ms, r.e2e_p90_ms, r.e2e_p99_ms,
            r.duration_s, r.requests_per_s, r.output_tokens_per_s, r.prompt_tokens, r.hit_tokens, r.hit_rate, r.oracle.hit_rate, r.hit_rate_vs_oracle, r.spread, r.front_cpu_s_per_1k,
            csv(r.filter.route_us.map(|q| q.0)), csv(r.filter.route_us.map(|q| q.1)),
            csv(r.filter.tokenize_us.map(|q| q.0)), csv(r.filter.tokenize_us.map(|q| q.1))
        );
    }
    std::fs::write(path, s)?;
    Ok(())
}
