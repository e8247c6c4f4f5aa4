//! Several runs of the same comparison, summed up as medians and ranges.
//!
//! This machine is noisy (two cores shared by the load generator, the front and eight pods):
//! one run's ratio of 1.05 against a peer can be 0.95 in the next. So the goals are read from
//! the median of each measure over `--repeat` runs, and the table shows each median with the
//! range it came from.

use crate::policies::PolicyRun;
use std::fmt::Write as _;

/// Median of `v` (the mean of the middle two for an even count); NaN when empty.
pub fn median(v: &[f64]) -> f64 {
    let mut v: Vec<f64> = v.iter().copied().filter(|x| !x.is_nan()).collect();
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// The runs of one (workload, front) pair, in the order first seen.
fn groups(runs: &[PolicyRun]) -> Vec<Vec<&PolicyRun>> {
    let mut out: Vec<Vec<&PolicyRun>> = Vec::new();
    for r in runs {
        match out
            .iter_mut()
            .find(|g| g[0].workload == r.workload && g[0].policy == r.policy)
        {
            Some(g) => g.push(r),
            None => out.push(vec![r]),
        }
    }
    out
}

/// One run per (workload, front) whose measures are the medians over its repeats (the rest,
/// such as the per-pod counts and TTFT samples, from the first run): what the goals read.
pub fn medians(runs: &[PolicyRun]) -> Vec<PolicyRun> {
    groups(runs)
        .into_iter()
        .map(|g| {
            let m = |f: fn(&PolicyRun) -> f64| median(&g.iter().map(|r| f(r)).collect::<Vec<_>>());
            PolicyRun {
                ttft_p50_ms: m(|r| r.ttft_p50_ms),
                ttft_p90_ms: m(|r| r.ttft_p90_ms),
                ttft_p99_ms: m(|r| r.ttft_p99_ms),
                e2e_p50_ms: m(|r| r.e2e_p50_ms),
                e2e_p90_ms: m(|r| r.e2e_p90_ms),
                e2e_p99_ms: m(|r| r.e2e_p99_ms),
                duration_s: m(|r| r.duration_s),
                requests_per_s: m(|r| r.requests_per_s),
                output_tokens_per_s: m(|r| r.output_tokens_per_s),
                hit_rate: m(|r| r.hit_rate),
                hit_rate_vs_oracle: m(|r| r.hit_rate_vs_oracle),
                spread: m(|r| r.spread),
                front_cpu_s_per_1k: m(|r| r.front_cpu_s_per_1k),
                errors: g.iter().map(|r| r.errors).max().unwrap_or(0),
                run: 0,
                ..g[0].clone()
            }
        })
        .collect()
}

/// The medians with their ranges (min–max), for the measures the goals read.
pub fn table(runs: &[PolicyRun]) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "{:<23} {:<25} {:>4} {:>22} {:>22} {:>22}",
        "workload", "front", "runs", "req/s", "TTFT p90 ms", "hit rate"
    );
    let cell = |v: Vec<f64>, prec: usize| {
        let lo = v.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        format!("{:.p$} [{lo:.p$}–{hi:.p$}]", median(&v), p = prec)
    };
    for g in groups(runs) {
        let col = |f: fn(&PolicyRun) -> f64| g.iter().map(|r| f(r)).collect::<Vec<_>>();
        let _ = writeln!(
            s,
            "{:<23} {:<25} {:>4} {:>22} {:>22} {:>22}",
            g[0].workload,
            g[0].policy,
            g.len(),
            cell(col(|r| r.requests_per_s), 1),
            cell(col(|r| r.ttft_p90_ms), 0),
            cell(col(|r| r.hit_rate), 3),
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn medians_of_odd_and_even_counts() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), 2.5);
        assert!(median(&[]).is_nan());
        assert_eq!(median(&[f64::NAN, 5.0]), 5.0);
    }

    #[test]
    fn each_front_and_workload_gets_its_own_medians() {
        let run = |run, workload, policy, rps, p90| PolicyRun {
            run,
            workload,
            policy,
            requests_per_s: rps,
            ttft_p90_ms: p90,
            ..PolicyRun::default()
        };
        let runs = [
            run(1, "w", "prefix", 10.0, 100.0),
            run(1, "w", "round_robin", 5.0, 300.0),
            run(2, "w", "prefix", 30.0, 90.0),
            run(2, "w", "round_robin", 6.0, 200.0),
            run(3, "w", "prefix", 20.0, 500.0),
        ];
        let m = medians(&runs);
        assert_eq!(m.len(), 2);
        assert_eq!(
            (m[0].policy, m[0].requests_per_s, m[0].ttft_p90_ms),
            ("prefix", 20.0, 100.0)
        );
        assert_eq!((m[1].requests_per_s, m[1].ttft_p90_ms), (5.5, 250.0));
        let t = table(&runs);
        assert!(t.contains("20.0 [10.0–30.0]"), "{t}");
    }
}
