//! The policy comparison as a table, JSON and CSV, plus the goals as ratios.

use super::overhead::FilterTimes;
use super::policies::{PolicyRun, CLOSED_LOOP, HOT_SATURATED, IP_HOT_GROUPS, SATURATED};
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

/// Against the peer routers (reported when their rows are there), issue 44's goals: on each
/// shared-prefix workload, policy `prefix`'s req/s (≥ 1.1×), TTFT p90 (≤ 0.9×) and hit rate
/// (≥ 1.0×) as ratios of the best peer's on that measure; on the hot groups also against round
/// robin (req/s ≥ 1.0×, a lower p90); and the proxies' own comparability (round robin through
/// each). Read from the medians when the runs were repeated.
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
    let open_loop = ["shared-prefix", "hot-tenant", "multi-turn"];
    for w in CLOSED_LOOP.into_iter().chain(open_loop) {
        let Some(p) = find(runs, w, "prefix") else {
            continue;
        };
        let peers: Vec<&PolicyRun> = runs
            .iter()
            .filter(|r| r.workload == w)
            .filter(is_peer_aware)
            .collect();
        if peers.is_empty() {
            continue;
        }
        let best_rps = peers
            .iter()
            .map(|r| r.requests_per_s)
            .fold(f64::NAN, f64::max);
        let best_p90 = peers.iter().map(|r| r.ttft_p90_ms).fold(f64::NAN, f64::min);
        let best_hit = peers.iter().map(|r| r.hit_rate).fold(f64::NAN, f64::max);
        let rps = p.requests_per_s / best_rps;
        let p90 = p.ttft_p90_ms / best_p90;
        let hit = p.hit_rate / best_hit;
        let _ = write!(
            s,
            "  {w}: req/s {rps:.2}× best peer (goal ≥ 1.1: {}); TTFT p90 {p90:.2}× (≤ 0.9: {}); hit rate {:.3} vs {best_hit:.3}, {hit:.2}× (≥ 1.0: {})",
            mark(rps >= 1.1), mark(p90 <= 0.9), p.hit_rate, mark(hit >= 1.0)
        );
        if let Some(rr) = find(runs, w, "round_robin") {
            let (rps_rr, p90_rr) = (
                p.requests_per_s / rr.requests_per_s,
                p.ttft_p90_ms / rr.ttft_p90_ms,
            );
            let hot = [HOT_SATURATED, IP_HOT_GROUPS].contains(&w);
            let goal = if hot {
                format!(
                    " (hot groups: ≥ 1.0 and a lower p90: {})",
                    mark(rps_rr >= 1.0 && p90_rr < 1.0)
                )
            } else {
                String::new()
            };
            let _ = write!(
                s,
                "; vs round robin req/s {rps_rr:.2}×, p90 {p90_rr:.2}×{goal}"
            );
        }
        let _ = writeln!(s);
    }
    for w in CLOSED_LOOP {
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
    let mut s = String::from("run,workload,policy,requests,ok,errors,ttft_p50_ms,ttft_p90_ms,ttft_p99_ms,e2e_p50_ms,e2e_p90_ms,e2e_p99_ms,duration_s,requests_per_s,output_tokens_per_s,prompt_tokens,hit_tokens,hit_rate,oracle_hit_rate,hit_rate_vs_oracle,spread,front_cpu_s_per_1k,filter_route_p50_us,filter_route_p99_us,filter_tokenize_p50_us,filter_tokenize_p99_us\n");
    for r in runs {
        let _ = writeln!(
            s,
            "{},{},{},{},{},{},{:.3},{:.3},{:.3},{:.3},{:.3},{:.3},{:.3},{:.3},{:.3},{},{},{:.5},{:.5},{:.4},{:.3},{:.4},{},{},{},{}",
            r.run, r.workload, r.policy, r.requests, r.ok, r.errors, r.ttft_p50_ms, r.ttft_p90_ms, r.ttft_p99_ms, r.e2e_p50_ms, r.e2e_p90_ms, r.e2e_p99_ms,
            r.duration_s, r.requests_per_s, r.output_tokens_per_s, r.prompt_tokens, r.hit_tokens, r.hit_rate, r.oracle.hit_rate, r.hit_rate_vs_oracle, r.spread, r.front_cpu_s_per_1k,
            csv(r.filter.route_us.map(|q| q.0)), csv(r.filter.route_us.map(|q| q.1)),
            csv(r.filter.tokenize_us.map(|q| q.0)), csv(r.filter.tokenize_us.map(|q| q.1))
        );
    }
    std::fs::write(path, s)?;
    Ok(())
}
